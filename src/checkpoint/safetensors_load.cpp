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

#include <unordered_map>

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
  std::vector<std::pair<const ShardedTensor*, const SafetensorsLocation*>> to_read;
};

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
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      if (!options.unreadable.count(name))
        missing.push_back(fmt::format("'{}' {}", name, shape_str(s.global_shape)));
      continue;
    }
    const SafetensorsEntry& e = it->second.entry;
    if (e.shape != s.global_shape) {
      out.problems.push_back(fmt::format("tensor '{}' has shape {} in {}; the model's is {}", name,
                                         shape_str(e.shape), it->second.file,
                                         shape_str(s.global_shape)));
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
      out.to_read.emplace_back(&s, &it->second);
    }
  }
  if (!missing.empty()) {
    out.problems.push_back(fmt::format("missing tensors: {}", fmt::join(missing, ", ")));
  }
  for (const auto& [name, where] : tensors) {
    if (by_name.count(name) || (options.ignore && options.ignore(name))) continue;
    auto alias = alias_of.find(name);
    if (alias == alias_of.end()) {
      unexpected.push_back(fmt::format("'{}' (in {})", name, where.file));
    } else if (where.entry.shape != by_name.at(alias->second)->global_shape) {
      out.problems.push_back(fmt::format("'{}' has shape {} in {}; it is the model's '{}' of {}",
                                         name, shape_str(where.entry.shape), where.file,
                                         alias->second,
                                         shape_str(by_name.at(alias->second)->global_shape)));
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
      for (const auto& [s, where] : checked.to_read) {
        auto rows = read_safetensors_rows(where->file, where->entry, s->row_offset,
                                          s->row_offset + s->rows());
        staged.emplace_back(s->local, rows.view(s->local.sizes()));
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
