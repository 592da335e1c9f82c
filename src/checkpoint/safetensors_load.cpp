// Safetensors files into a (sharded) model, each rank reading only its rows: the one loader
// behind load_safetensors_sharded (one file) and load_hf_weights (a directory's shards).
//
// Three phases on every rank: (1) check every tensor's name, shape and dtype against the
// model's state dict, collecting every problem; (2) read this rank's rows of each tensor into
// staging tensors (only when (1) found nothing); (3) agree (fsdp/comm/agree.h), then copy the
// staged rows into the parameters. A failure on any rank therefore fails every rank before any
// parameter changes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tuple>
#include <unordered_map>

#include "checkpoint/dim_shards.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "util/check.h"
#include "util/format.h"

namespace fsdp {
namespace {

using detail::shape_str;

// The problems of `tensors` against the model's state dict, and what each rank reads.
struct Checked {
  std::vector<std::string> problems;
  std::vector<std::tuple<std::string, const ShardedTensor*, const SafetensorsLocation*>> to_read;
};

// The shape a file must hold for a parameter: the full tensor of its TP slice, else its own.
std::vector<int64_t> file_shape(const std::string& name, const ShardedTensor& s,
                                const ShardedLoadOptions& options) {
  auto it = options.slices.find(name);
  return it == options.slices.end() ? s.global_shape : it->second.full;
}

// This rank's rows of a parameter from its file: the shard's rows of the parameter, which under
// tensor parallelism are rows of this rank's slice of the file's tensor.
at::Tensor read_rows(const std::string& name, const ShardedTensor& s,
                     const SafetensorsLocation& where, const ShardedLoadOptions& options) {
  if (s.shard_dim != 0 && !s.replicated) {
    // A chunk of another dim (Shard(d > 0)): every row, then this rank's chunk.
    ShardedTensor whole = s;
    whole.local = at::empty(s.global_shape, s.local.options().device(at::kMeta));
    whole.row_offset = 0;
    whole.shard_dim = 0;
    return detail::chunk_for(read_rows(name, whole, where, options), s).contiguous();
  }
  auto it = options.slices.find(name);
  if (it == options.slices.end()) {
    return read_safetensors_rows(where.file, where.entry, s.row_offset, s.row_offset + s.rows());
  }
  const tp::TpSlice& slice = it->second;
  if (slice.dim == 0) {
    const int64_t first = slice.chunk.offset + s.row_offset;
    return read_safetensors_rows(where.file, where.entry, first, first + s.rows());
  }
  // Columns: the shard's rows whole, then this rank's columns of them.
  return read_safetensors_rows(where.file, where.entry, s.row_offset, s.row_offset + s.rows())
      .narrow(slice.dim, slice.chunk.offset, slice.chunk.length);
}

Checked check(const SafetensorsLocations& tensors, const torch::nn::Module& model,
              const ShardedStateDict& state, const ShardedLoadOptions& options) {
  Checked out;
  out.problems = options.problems;
  // A tensor registered under several names (a tied head) is in the state dict once, under
  // its first name; its other names may be in the files too.
  std::unordered_map<std::string, const ShardedTensor*> by_name;
  for (const auto& [name, s] : state) by_name[name] = &s;
  std::unordered_map<const void*, std::string> first_name;
  std::unordered_map<std::string, std::string> alias_of;  // other name -> first name
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    auto [it, fresh] = first_name.emplace(p.value().unsafeGetTensorImpl(), p.key());
    if (!fresh) alias_of[p.key()] = it->second;
  }
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, s] : state) {
    if (options.keep && !options.keep(name)) continue;
    auto it = tensors.find(name);
    const auto expected = file_shape(name, s, options);
    if (it == tensors.end()) {
      if (!options.unreadable.count(name))
        missing.push_back(fmt::format("'{}' {}", name, shape_str(expected)));
      continue;
    }
    const SafetensorsEntry& e = it->second.entry;
    if (e.shape != expected) {
      out.problems.push_back(fmt::format("tensor '{}' has shape {} in {}; the model's is {}", name,
                                         shape_str(e.shape), it->second.file, shape_str(expected)));
    } else if (s.local.is_floating_point() && !at::isFloatingType(e.dtype)) {
      out.problems.push_back(
          fmt::format("'{}' is {} in {}; expected a floating dtype (F32, BF16, "
                      "F16 or F64)",
                      name, c10::toString(e.dtype), it->second.file));
    } else if (!s.local.is_floating_point() && e.dtype != s.local.scalar_type()) {
      out.problems.push_back(fmt::format("'{}' is {} in {}; the model's is {}", name,
                                         c10::toString(e.dtype), it->second.file,
                                         c10::toString(s.local.scalar_type())));
    } else {
      out.to_read.emplace_back(name, &s, &it->second);
    }
  }
  if (!missing.empty()) {
    out.problems.push_back(fmt::format("missing tensors: {}", fmt::join(missing, ", ")));
  }
  for (const auto& [name, where] : tensors) {
    if (options.ignore && options.ignore(name)) continue;
    // A tensor of the model that `keep` leaves out is not the file's to set: unexpected.
    if (by_name.count(name) && (!options.keep || options.keep(name))) continue;
    auto alias = alias_of.find(name);
    if (alias == alias_of.end()) {
      unexpected.push_back(fmt::format("'{}' (in {})", name, where.file));
    } else if (const auto want = file_shape(alias->second, *by_name.at(alias->second), options);
               where.entry.shape != want) {
      out.problems.push_back(fmt::format("'{}' has shape {} in {}; it is the model's '{}' of {}",
                                         name, shape_str(where.entry.shape), where.file,
                                         alias->second, shape_str(want)));
    }
  }
  if (!unexpected.empty()) {
    out.problems.push_back(
        fmt::format("tensors the model does not have: {}", fmt::join(unexpected, ", ")));
  }
  return out;
}

}  // namespace

SafetensorsLocations locate_safetensors(const std::string& path) {
  SafetensorsLocations out;
  for (auto& e : read_safetensors_index(path).entries) {
    std::string name = e.name;
    out.emplace(std::move(name), SafetensorsLocation{path, std::move(e)});
  }
  return out;
}

void load_safetensors_sharded(const SafetensorsLocations& tensors, torch::nn::Module& model,
                              const ProcessGroupPtr& pg, const std::string& what,
                              const ShardedLoadOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "{}: the process group is null", what);
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;  // (this rank's rows, values read)
  agree_on<CheckpointError>(*pg, what, [&] {
    const auto state = get_model_state_dict(model);  // names and rows: no communication
    auto checked = check(tensors, model, state, options);
    auto& problems = checked.problems;
    if (problems.empty()) {
      // s->local is the live parameter (this rank's rows): staged, copied after agreement.
      for (const auto& [name, s, where] : checked.to_read) {
        auto rows = read_rows(name, *s, *where, options);
        staged.emplace_back(s->local, rows.reshape(s->local.sizes()));
      }
    }
    if (problems.size() == 1) throw CheckpointError(problems[0]);
    if (problems.size() > 1) {
      throw CheckpointError(
          fmt::format("{} problems: {}", problems.size(), fmt::join(problems, "; ")));
    }
  });
  at::NoGradGuard no_grad;
  for (auto& [target, value] : staged) target.copy_(value);
}

void load_safetensors_sharded(const std::string& path, torch::nn::Module& model,
                              const ProcessGroupPtr& pg) {
  FSDP_CHECK_ARG(pg != nullptr, "load_safetensors_sharded: the process group is null");
  const std::string what = fmt::format("load_safetensors_sharded {}", path);
  SafetensorsLocations tensors;
  // A file that cannot be read fails on every rank alike, before the load's own agreement.
  agree_on<CheckpointError>(*pg, what, [&] { tensors = locate_safetensors(path); });
  load_safetensors_sharded(tensors, model, pg, what);
}

}  // namespace fsdp
