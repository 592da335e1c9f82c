// LoRA adapters (Hu et al. 2021, "Low-Rank Adaptation"), as PEFT's LoraConfig puts them on a
// Linear layer: y = W x + b + (B (A dropout(x))) * alpha / rank, with A [rank, in] drawn as
// nn.Linear's weight (kaiming-uniform, a = sqrt(5)) and B [out, rank] zero, so that a fresh
// adapter changes nothing. The adapters are child modules named "lora_A" and "lora_B" of the
// Linear they adapt, so their parameters are "<linear>.lora_A.weight" and
// "<linear>.lora_B.weight": PEFT's names without its "base_model.model." prefix and adapter name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::models {

struct LoraOptions {
  int64_t rank = 0;  // 0: no adapters
  double alpha = 8;  // PEFT's default lora_alpha; the update is scaled by alpha / rank
  double dropout = 0;
  // The Linears adapted, by their own names in every decoder layer (PEFT's target_modules):
  // any of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. PEFT's default for
  // Llama: q_proj and v_proj.
  std::vector<std::string> targets = {"q_proj", "v_proj"};

  bool enabled() const { return rank > 0; }
  double scaling() const { return alpha / static_cast<double>(rank); }
};

// The names a target may take (the Llama model's Linears inside a decoder layer).
const std::vector<std::string>& lora_target_names();

// Whether a parameter name is an adapter's: it ends in ".lora_A.weight" or ".lora_B.weight".
bool is_lora_parameter(const std::string& name);

// The adapted Linear's name of an adapter parameter ("model.layers.0.self_attn.q_proj" for
// "model.layers.0.self_attn.q_proj.lora_A.weight"); empty for other names.
std::string lora_owner(const std::string& name);

}  // namespace fsdp::models
