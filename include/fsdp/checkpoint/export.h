// A sharded model as one safetensors file: the bridge to inference and to other frameworks
// (PyTorch, Hugging Face, MLX and llama.cpp's converters read safetensors).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/parallel/tensor_parallel.h"

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
// memory is about one parameter. The directory of `path` is made if missing. Written to
// "<path>.tmp-<pid>-<n>", flushed to the disk and
// renamed into place (io::publish), so `path` is never a partial file; an existing file at
// `path` is replaced (the trainers refuse one before training). A failure on any rank is
// CheckpointError on every rank, and removes the staged file.
void export_safetensors(const std::string& path, const torch::nn::Module& model,
                        const ProcessGroupPtr& pg, const ExportOptions& options = {});

// Collective. Sets `model`'s parameters and buffers (sharded or not) from a safetensors file,
// each rank reading only its own rows, converting dtypes (a floating tensor from a floating
// one). Every parameter and buffer must be in the file with its shape; the file may hold
// nothing else (a tied tensor's other names are accepted). Checked on every rank before any
// parameter changes; CheckpointError naming every problem otherwise.
void load_safetensors_sharded(const std::string& path, torch::nn::Module& model,
                              const ProcessGroupPtr& pg);

// Where one tensor of a set of safetensors files is.
struct SafetensorsLocation {
  std::string file;  // the file's path
  SafetensorsEntry entry;
};
// Tensors by name, possibly over several files (a Hugging Face directory's shards).
using SafetensorsLocations = std::map<std::string, SafetensorsLocation>;

// Every tensor of the safetensors file `path`, from its header (FormatError when malformed).
SafetensorsLocations locate_safetensors(const std::string& path);

struct ShardedLoadOptions {
  // Problems the caller found already (a missing file, an index that disagrees with its files):
  // reported together with the load's own.
  std::vector<std::string> problems;
  // Names whose file could not be read (reported among `problems`): not reported missing.
  std::set<std::string> unreadable;
  // Entries the model need not have, skipped (transformers ignores "rotary_emb.inv_freq").
  std::function<bool(const std::string&)> ignore;
  // Tensor parallelism: the slice of a file's tensor (by name) that the model's parameter holds
  // (its shard's rows are rows of that slice); the files hold the full tensors. Null, or no
  // entry for a name: the parameter is the whole tensor.
  std::map<std::string, tp::TpSlice> slices;
  // The model's tensors to load (null: all). Those it refuses are left as they are and not
  // reported missing; a file that holds one is reported (unexpected). LoRA: the base weights
  // without the adapters, or the adapters alone.
  std::function<bool(const std::string&)> keep;
};

// The loader behind load_safetensors_sharded and load_hf_weights: collective; each rank checks
// `tensors` against the model's state dict (missing, unexpected, mis-shaped and non-floating
// tensors, each named), reads only its rows, and the ranks agree before any parameter changes;
// CheckpointError "<what>: rank r: <problems>" on every rank otherwise.
void load_safetensors_sharded(const SafetensorsLocations& tensors, torch::nn::Module& model,
                              const ProcessGroupPtr& pg, const std::string& what,
                              const ShardedLoadOptions& options = {});

}  // namespace fsdp
