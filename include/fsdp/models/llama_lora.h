// LoRA on the Llama model (lora_options.h, BuildOptions::lora) and PEFT's adapter directories:
//
//   ll::BuildOptions build;
//   build.lora = {.rank = 8, .alpha = 16, .targets = {"q_proj", "v_proj"}};
//   ... build or load_hf_model with it, fully_shard, train (the optimizer over the parameters
//   that require a gradient: the adapters) ...
//   ll::save_peft_adapter(out, *model, build.lora, pg);   // PEFT's PeftModel.from_pretrained
//   ll::save_hf_checkpoint(merged, *model, config, pg);   // the adapters merged into the weights
//
// PEFT's adapter directory (peft 0.21's save_pretrained): adapter_config.json (peft_type "LORA",
// task_type "CAUSAL_LM", r, lora_alpha, lora_dropout, target_modules, ...) and
// adapter_model.safetensors, whose tensors are named "base_model.model.<the model's name>", e.g.
// base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight.
#pragma once

#include <torch/nn/module.h>

#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/lora_options.h"

namespace fsdp::models::llama {

// InvalidArgument, naming what is wrong, unless `lora` can adapt a model of `config` at
// `tp_size`: a rank (when enabled) that every target's weight has in both dimensions, an alpha
// above zero, a dropout in [0, 1), targets among lora_target_names() with none twice, no
// tensor parallelism. A disabled `lora` (rank 0) is valid.
void validate_lora(const Config& config, const LoraOptions& lora, int tp_size = 1);

// The adapters' parameters: rank x (in + out) per target per layer (0 when disabled).
int64_t lora_parameter_count(const Config& config, const LoraOptions& lora);

// The LoRA options of a PEFT adapter directory's adapter_config.json (r, lora_alpha,
// lora_dropout, target_modules). Local. CheckpointError when the file is missing or malformed,
// or describes what this library does not build: another peft_type, bias other than "none",
// fan_in_fan_out, use_rslora, use_dora, modules_to_save, rank_pattern or alpha_pattern,
// layers_to_transform, or target_modules as a regular expression.
LoraOptions read_peft_adapter_config(const std::string& dir);

struct PeftSaveOptions {
  // adapter_config.json's base_model_name_or_path (PEFT's AutoPeftModel loads it from there).
  std::string base_model;
  torch::ScalarType dtype = torch::kFloat;  // the tensors' dtype in the file
};

// Collective over `world`. Rank 0 writes PEFT's adapter directory `dir` of the model's adapters
// (gathered one at a time; the frozen weights are not touched), atomically as
// save_hf_checkpoint does. CheckpointError on every rank, before anything is gathered, when
// `dir` exists and is not an empty directory, the model has no adapters, or `lora` does not
// describe them (adapter_config.json must say what the tensors are).
void save_peft_adapter(const std::string& dir, const torch::nn::Module& model,
                       const LoraOptions& lora, const ProcessGroupPtr& world,
                       const PeftSaveOptions& options = {});

// Collective over `world`. Sets the model's adapters from PEFT's adapter directory `dir` (each
// rank reads its rows), leaving every other parameter as it is. The directory's rank, alpha and
// targets must be `lora`'s (the model's); every adapter tensor of the model must be in the file
// with its shape and the file may hold no other. CheckpointError on every rank naming every
// problem, before any parameter changes.
void load_peft_adapter(const std::string& dir, torch::nn::Module& model, const LoraOptions& lora,
                       const ProcessGroupPtr& world);

}  // namespace fsdp::models::llama
