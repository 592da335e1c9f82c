#include "fsdp/checkpoint/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/agreement.h"
#include "util/check.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/runtime/layout.h"
#include "runtime/collectives.h"
#include "runtime/local_shards.h"

namespace fsdp {
namespace {

// The full tensor of a parameter, on every rank: gathered over the group it is sharded on
// (with hybrid sharding, this rank's replica).
at::Tensor gather_full(const detail::LocalShard& s) {
  if (s.replicated) return s.tensor.detach();
  return detail::all_gather_full(*s.shard_group, s.tensor, s.full_shape);
}

at::ScalarType export_dtype(const at::Tensor& t, const ExportOptions& o) {
  return o.dtype && t.is_floating_point() ? *o.dtype : t.scalar_type();
}

}  // namespace

void export_safetensors(const std::string& path, const torch::nn::Module& model,
                        const ProcessGroupPtr& pg, const ExportOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "export_safetensors: the process group is null");
  auto& g = *pg;
  const bool writer_rank = g.rank() == 0;
  const std::string tmp = path + ".tmp";
  const std::string what = fmt::format("export_safetensors {}", path);
  std::vector<detail::LocalShard> shards;
  std::unique_ptr<SafetensorsWriter> writer;
  std::string error;
  try {
    shards = detail::local_shards(model);
    if (writer_rank) {
      std::vector<SafetensorsWriter::Spec> specs;
      for (const auto& s : shards) {
        specs.push_back({s.name, export_dtype(s.tensor, options), s.full_shape});
      }
      for (const auto& b : model.named_buffers(true)) {
        specs.push_back({b.key(), export_dtype(b.value(), options), b.value().sizes().vec()});
      }
      writer = std::make_unique<SafetensorsWriter>(tmp, std::move(specs), options.metadata);
    }
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(g, what, error);
  // Every rank joins every gather; a write error on rank 0 is reported after the last one.
  for (const auto& s : shards) {
    auto full = gather_full(s);
    if (!writer_rank || !error.empty()) continue;
    try {
      writer->write_next(full.to(export_dtype(s.tensor, options)));
    } catch (...) {
      error = detail::current_exception_message();
    }
  }
  if (writer_rank && error.empty()) {
    try {
      for (const auto& b : model.named_buffers(true)) {
        writer->write_next(b.value().to(export_dtype(b.value(), options)));
      }
      writer->finish();
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw CheckpointError(fmt::format("cannot rename {} to {}", tmp, path));
      }
    } catch (...) {
      error = detail::current_exception_message();
    }
  }
  if (writer_rank && !error.empty()) std::remove(tmp.c_str());
  detail::agree_or_throw(g, what, error);
}

void load_safetensors_sharded(const std::string& path, torch::nn::Module& model,
                              const ProcessGroupPtr& pg) {
  FSDP_CHECK_ARG(pg != nullptr, "load_safetensors_sharded: the process group is null");
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;  // (target, value read)
  std::string error;
  try {
    auto index = read_safetensors_index(path);
    std::unordered_map<std::string, const SafetensorsEntry*> by_name;
    for (const auto& e : index.entries) by_name[e.name] = &e;
    std::unordered_set<std::string> accepted;
    for (const auto& item : model.named_parameters(true)) accepted.insert(item.key());
    auto stage = [&](const std::string& name, const at::Tensor& target, int64_t row_begin,
                     int64_t row_end, const std::vector<int64_t>& shape) {
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        throw CheckpointError(fmt::format("{} has no tensor '{}' (the model's)", path, name));
      }
      if (it->second->shape != shape) {
        throw CheckpointError(fmt::format("tensor '{}' has shape [{}] in {}, the model's is [{}]",
                                          name, fmt::join(it->second->shape, ", "), path,
                                          fmt::join(shape, ", ")));
      }
      auto rows = read_safetensors_rows(path, *it->second, row_begin, row_end);
      staged.emplace_back(target, rows.view(target.sizes()));
    };
    for (const auto& s : detail::local_shards(model)) {
      stage(s.name, s.tensor, s.row_begin, s.row_end, s.full_shape);
    }
    for (const auto& b : model.named_buffers(true)) {
      accepted.insert(b.key());
      const auto& t = b.value();
      stage(b.key(), t, 0, t.dim() == 0 ? 1 : t.size(0), t.sizes().vec());
    }
    for (const auto& e : index.entries) {
      if (!accepted.count(e.name)) {
        throw CheckpointError(
            fmt::format("{} holds '{}', which the model does not have", path, e.name));
      }
    }
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(*pg, fmt::format("load_safetensors_sharded {}", path), error);
  at::NoGradGuard no_grad;
  for (auto& [target, value] : staged) target.copy_(value);
}

}  // namespace fsdp
