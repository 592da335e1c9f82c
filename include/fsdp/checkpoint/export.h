// A sharded model as one safetensors file: the bridge to inference and to other frameworks
// (PyTorch, Hugging Face, MLX and llama.cpp's converters read safetensors).
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <optional>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp {

struct ExportOptions {
  // Convert every floating tensor to this dtype (kBFloat16 for a half-size file); unset: as
  // the parameters are.
  std::optional<at::ScalarType> dtype;
  std::map<std::string, std::string> metadata;  // the file's __metadata__
};

// Collective. Rank 0 writes `path`: every parameter of `model` (sharded by fully_shard or not,
// nested units included) under its name in named_parameters() (a tied tensor once, under its
// first name), then its buffers. Parameters are gathered one at a time, so every rank's extra
// memory is about one parameter. Written to path + ".tmp" and renamed into place. A failure on
// any rank is CheckpointError on every rank.
void export_safetensors(const std::string& path, const torch::nn::Module& model,
                        const ProcessGroupPtr& pg, const ExportOptions& options = {});

// Collective. Sets `model`'s parameters and buffers (sharded or not) from a safetensors file,
// each rank reading only its own rows, converting dtypes. Every parameter and buffer must be in
// the file with its shape; the file may hold nothing else (a tied tensor's other names are
// accepted). Checked on every rank before any parameter changes; CheckpointError otherwise.
void load_safetensors_sharded(const std::string& path, torch::nn::Module& model,
                              const ProcessGroupPtr& pg);

}  // namespace fsdp
