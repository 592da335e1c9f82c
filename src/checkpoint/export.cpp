#include "fsdp/checkpoint/export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/agreement.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/io/safetensors.h"
#include "util/check.h"

namespace fsdp {

void export_safetensors(const std::string& path, const torch::nn::Module& model,
                        const ProcessGroupPtr& pg, const ExportOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "export_safetensors: the process group is null");
  auto& g = *pg;
  const bool writer_rank = g.rank() == 0;
  const std::string tmp = path + ".tmp";
  const std::string what = fmt::format("export_safetensors {}", path);
  std::unique_ptr<SafetensorsWriter> writer;
  std::string error;
  try {
    if (writer_rank) {
      std::vector<SafetensorsWriter::Spec> specs;
      for (const auto& [name, t] : get_model_state_dict(model)) {
        const auto dtype =
            options.dtype && t.local.is_floating_point() ? *options.dtype : t.local.scalar_type();
        specs.push_back({name, dtype, t.global_shape});
      }
      writer = std::make_unique<SafetensorsWriter>(tmp, std::move(specs), options.metadata);
    }
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(g, what, error);
  // Every rank joins every gather; a write error on rank 0 is reported after the last one.
  FullStateDictOptions full;
  full.rank0_only = true;
  full.dtype = options.dtype;
  for_each_full_tensor(model, pg, full, [&](const std::string&, const at::Tensor& t) {
    if (!error.empty()) return;
    try {
      writer->write_next(t);
    } catch (...) {
      error = detail::current_exception_message();
    }
  });
  if (writer_rank && error.empty()) {
    try {
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
    for (const auto& [name, t] : get_model_state_dict(model)) {
      accepted.insert(name);
      auto it = by_name.find(name);
      if (it == by_name.end()) {
        throw CheckpointError(fmt::format("{} has no tensor '{}' (the model's)", path, name));
      }
      if (it->second->shape != t.global_shape) {
        throw CheckpointError(fmt::format("tensor '{}' has shape [{}] in {}, the model's is [{}]",
                                          name, fmt::join(it->second->shape, ", "), path,
                                          fmt::join(t.global_shape, ", ")));
      }
      auto rows = read_safetensors_rows(path, *it->second, t.row_offset, t.row_offset + t.rows());
      staged.emplace_back(t.local, rows.view(t.local.sizes()));
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
