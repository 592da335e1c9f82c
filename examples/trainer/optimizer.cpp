#include "optimizer.h"

#include <cmath>
#include <unordered_set>

#include "fsdp/fsdp.h"

namespace trainer {

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o,
                                                        const torch::nn::Module& module) {
  // Parameters in named_parameters() order, each tensor once; the shards' dimensions are the
  // full parameters' (dim 0 is split, not removed). Frozen parameters (LoRA's base weights)
  // get no state.
  std::vector<torch::Tensor> decay, no_decay;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.named_parameters(/*recurse=*/true)) {
    if (!p.value().requires_grad()) continue;
    if (!seen.insert(p.value().unsafeGetTensorImpl()).second) continue;
    (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  }
  auto options = [&](double wd) {
    return torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).eps(o.eps).weight_decay(wd);
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decay.empty()) {
    groups.emplace_back(decay,
                        std::make_unique<torch::optim::AdamWOptions>(options(o.weight_decay)));
  }
  if (!no_decay.empty()) {
    groups.emplace_back(no_decay, std::make_unique<torch::optim::AdamWOptions>(options(0.0)));
  }
  if (o.optimizer == OptimizerKind::fused_adamw) {
    auto fused = std::make_unique<fsdp::FusedAdamW>(groups, options(o.weight_decay));
    // --offload all: the shards are host tensors already, and their state with them.
    if (o.offload == Offload::optimizer) fused->set_state_offload(true);
    return fused;
  }
  return std::make_unique<torch::optim::AdamW>(groups, options(o.weight_decay));
}

double lr_at(const TrainOptions& o, int step) {
  if (step < o.warmup) return o.lr * (step + 1) / o.warmup;
  if (o.lr_schedule == LrSchedule::constant) return o.lr;
  const double progress = static_cast<double>(step - o.warmup) / std::max(1, o.steps - o.warmup);
  return o.lr_min + 0.5 * (o.lr - o.lr_min) * (1 + std::cos(M_PI * progress));
}

void set_lr(torch::optim::Optimizer& opt, double lr) {
  for (auto& group : opt.param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
}

}  // namespace trainer
