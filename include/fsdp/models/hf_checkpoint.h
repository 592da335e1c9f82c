// Hugging Face model directories in and out of a (sharded) Llama model: config.json,
// generation_config.json, model.safetensors or model-0000k-of-0000n.safetensors shards with
// model.safetensors.index.json ("weight_map"), and the tokenizer's files, as transformers'
// save_pretrained writes them and from_pretrained, MLX (mlx_lm) and llama.cpp's converter read
// them.
//
//   auto config = read_hf_config(dir);
//   BuildOptions build;
//   build.random_init = false;                   // the load overwrites every parameter
//   build.on_layer_built = [&](int64_t, auto& layer) { fsdp::fully_shard(layer, pg); };
//   auto model = build_llama(config, build);
//   auto root = fsdp::fully_shard(model, pg);
//   load_hf_weights(dir, *model, pg);            // each rank reads only its rows
//   ... train ...
//   save_hf_checkpoint(out_dir, *model, config, pg, {});
//
// Both are collective over `world` (every rank of the model's groups, the same arguments, the
// same order) and decide failures together: every rank throws the same CheckpointError, which
// lists every problem found (per rank), and neither leaves anything half done.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"

namespace fsdp::models::llama {

// The safetensors files of a Hugging Face directory, as transformers' from_pretrained picks
// them: model.safetensors when present, else the files model.safetensors.index.json's
// weight_map names (each once, in name order). CheckpointError naming the directory when it has
// neither, or the index is malformed. Local.
std::vector<std::string> hf_weight_files(const std::string& dir);

// Collective. Sets every parameter of `model` but LoRA's adapters (sharded by fully_shard or
// not) from the directory's safetensors files, each rank reading only its own rows of each
// tensor; F32, BF16 and F16 tensors are converted to the parameters' dtype. Names are the model's
// named_parameters(); a tied model accepts a file with or without lm_head.weight (ignored, as
// transformers ignores it), and rotary_emb.inv_freq entries of old conversions are ignored.
// Every rank checks everything before any parameter changes: missing tensors, unexpected ones,
// wrong shapes, other dtypes, a weight_map that disagrees with its files, a missing shard file,
// a malformed or truncated file. Any of these is CheckpointError on every rank, naming them
// all; the parameters are then as they were. Extra memory per rank: its rows of every tensor
// in the file's dtype, held until all ranks agree. Under tensor parallelism `slices`
// (tp_slices(config, tp size, tp rank)) says which slice of each tensor the model holds: each
// rank reads the rows of its shard of its slice (a row-parallel weight's rows whole, then its
// columns). `world` is every rank (the agreement spans them all).
void load_hf_weights(const std::string& dir, torch::nn::Module& model, const ProcessGroupPtr& world,
                     std::map<std::string, tp::TpSlice> slices = {});

// A model built from a directory, for the trainer: reads config.json, builds the model without
// random init, lets the caller shard it, then loads the weights (collective).
struct HfLoadOptions {
  torch::ScalarType dtype = torch::kFloat;  // the parameters' dtype
  LayerBuilt on_layer_built;                // shard each layer here
  // Called once every layer is built, before the weights are read: shard the root here, so that
  // each rank reads only its rows of the embedding and the head too.
  std::function<void(LlamaForCausalLM&)> on_model_built;
  // Tensor parallelism (BuildOptions::tp): each rank reads only its slice of its rows.
  ProcessGroupPtr tp;
  bool sequence_parallel = false;  // BuildOptions::sequence_parallel
  // LoRA adapters (BuildOptions::lora): drawn fresh, not read (a Hugging Face directory holds
  // the base model; load_peft_adapter reads adapters).
  LoraOptions lora;
  Float8Options float8;  // BuildOptions::float8
};
struct HfModel {
  Config config;
  LlamaForCausalLM model{nullptr};
};
HfModel load_hf_model(const std::string& dir, const ProcessGroupPtr& world,
                      const HfLoadOptions& options = {});

struct HfSaveOptions {
  // The tensors' dtype in the files: kFloat, kBFloat16 or kHalf; config.json's "dtype" says it.
  torch::ScalarType dtype = torch::kFloat;
  // Files above this many bytes of tensor data are split (transformers' max_shard_size, whose
  // default is 5 GB): model-0000k-of-0000n.safetensors and model.safetensors.index.json. A
  // tensor larger than the limit gets a file of its own.
  int64_t max_shard_bytes = 5'000'000'000;
  // Tokenizer files to copy into the directory: files, or directories from which
  // tokenizer.model, tokenizer.json, tokenizer_config.json, special_tokens_map.json and
  // added_tokens.json are copied when present.
  std::vector<std::string> tokenizer_files;
  // Tensor parallelism (BuildOptions::tp): each tensor is gathered whole and written once.
  ProcessGroupPtr tp;
};

// Collective. Rank 0 writes a Hugging Face directory `dir` of `model` (sharded by fully_shard
// or not) with `config` (which must describe the model: the parameters' names and shapes are
// checked against it): config.json in full, generation_config.json, the safetensors files with
// {"format": "pt"} metadata (a tied head once, as model.embed_tokens.weight, as transformers
// writes it), the index when sharded, and the tokenizer files. Streaming: every file's tensor
// list is planned from the global shapes, then the tensors are gathered one at a time
// (for_each_full_tensor, rank 0 only) and written as they arrive: no rank holds more than one
// full tensor. Atomic: everything goes to a sibling `<dir>.tmp-<pid>-<n>` which is fsynced and
// renamed into place. CheckpointError on every rank, before anything is gathered, when `dir`
// exists and is not an empty directory (nothing a user saved is overwritten), a tokenizer file
// is missing, the config does not match the model, or the dtype is not one of the three; and
// after, when writing failed on rank 0 (the temporary directory is then removed). A model with
// LoRA adapters (BuildOptions::lora) is written merged, as PEFT's merge_and_unload: each
// adapted weight W + (B @ A) * alpha / rank, computed in fp32, and no adapter tensors; the
// model itself is not changed.
void save_hf_checkpoint(const std::string& dir, const torch::nn::Module& model,
                        const Config& config, const ProcessGroupPtr& world,
                        const HfSaveOptions& options = {});

// The tokenizer file names copied from a directory in tokenizer_files.
const std::vector<std::string>& tokenizer_file_names();

}  // namespace fsdp::models::llama
