#include "llama/lora_merge.h"

#include <fmt/format.h>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/lora_options.h"

namespace fsdp::models::llama::detail {

std::map<std::string, double> lora_scalings(const torch::nn::Module& model) {
  std::map<std::string, double> out;
  for (const auto& m : model.named_modules()) {
    const auto* linear = dynamic_cast<const LinearImpl*>(m.value().get());
    if (linear && linear->lora_A) out[m.key()] = linear->lora_scaling();
  }
  return out;
}

LoraMerger::LoraMerger(std::map<std::string, double> scalings, Emit emit)
    : scalings_(std::move(scalings)), emit_(std::move(emit)) {}

void LoraMerger::add(const std::string& name, const at::Tensor& tensor) {
  const std::string owner = lora_owner(name);
  if (!owner.empty()) {
    if (owner != holding_) {
      throw CheckpointError(fmt::format("adapter '{}' arrived without its weight", name));
    }
    if (name.compare(name.size() - 14, 14, ".lora_A.weight") == 0) {
      a_ = tensor;
      return;
    }
    if (!a_.defined()) throw CheckpointError(fmt::format("'{}' arrived before lora_A", name));
    auto& weight = held_.front().second;
    // PEFT's get_delta_weight: (B @ A) * scaling, added to the weight (in fp32 here, so that a
    // bf16 model's merge rounds once).
    weight = (weight.to(at::kFloat) +
              at::matmul(tensor.to(at::kFloat), a_.to(at::kFloat)) * scalings_.at(owner))
                 .to(weight.scalar_type());
    for (const auto& [n, t] : held_) emit_(n, t);
    held_.clear();
    holding_.clear();
    a_ = at::Tensor();
    return;
  }
  if (!holding_.empty()) {
    held_.emplace_back(name, tensor);
    return;
  }
  const auto dot = name.rfind('.');
  if (dot != std::string::npos && name.substr(dot) == ".weight" &&
      scalings_.count(name.substr(0, dot))) {
    holding_ = name.substr(0, dot);
    held_.emplace_back(name, tensor);
    return;
  }
  emit_(name, tensor);
}

void LoraMerger::finish() {
  if (!holding_.empty()) {
    throw CheckpointError(fmt::format("the adapters of {} did not arrive", holding_));
  }
}

ShardedStateDict without_lora(ShardedStateDict state) {
  ShardedStateDict out;
  for (auto& entry : state) {
    if (!is_lora_parameter(entry.first)) out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace fsdp::models::llama::detail
