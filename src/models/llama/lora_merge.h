// Internal to save_hf_checkpoint: a model with LoRA adapters written as the plain model, each
// adapted weight merged (PEFT's merge_and_unload: W + (B @ A) * alpha / rank).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/checkpoint/state_dict.h"

namespace fsdp::models::llama::detail {

// The adapted Linears of `model` (by name: "model.layers.0.self_attn.q_proj") and their
// scaling; empty for a model without adapters.
std::map<std::string, double> lora_scalings(const torch::nn::Module& model);

// Rank 0's side of the streamed export. Tensors arrive in state dict order: an adapted
// Linear's weight, its bias, then its lora_A and lora_B. The weight (and what follows it) is
// held until lora_B arrives, then passed on merged, in fp32 and cast back to the weight's dtype;
// adapter tensors are never passed on. At most one Linear's tensors are held at a time.
class LoraMerger {
 public:
  using Emit = std::function<void(const std::string& name, const at::Tensor& tensor)>;
  LoraMerger(std::map<std::string, double> scalings, Emit emit);
  void add(const std::string& name, const at::Tensor& tensor);
  // Throws CheckpointError when a Linear's tensors did not all arrive.
  void finish();

 private:
  std::map<std::string, double> scalings_;
  Emit emit_;
  std::string holding_;  // the Linear whose weight is held; empty when none
  std::vector<std::pair<std::string, at::Tensor>> held_;
  at::Tensor a_;
};

// The state dict without the adapters' entries: the plain model's tensors.
ShardedStateDict without_lora(ShardedStateDict state);

}  // namespace fsdp::models::llama::detail
