// FusedAdamW: torch::optim::AdamW with its update done by libtorch's fused kernel
// (at::_fused_adamw_, CPU and CUDA), one pass over each parameter's memory instead of the nine
// elementwise ops torch::optim::AdamW runs per parameter. PyTorch's torch.optim.AdamW(fused=True).
//
// Same options (AdamWOptions: lr, betas, eps, weight_decay; amsgrad) and the same state
// (AdamWParamState: step, exp_avg, exp_avg_sq, max_exp_avg_sq) as torch::optim::AdamW, so a
// program switches by changing the type, and state saved by one loads into the other. Results
// equal torch::optim::AdamW's within float rounding (the kernel orders the arithmetic
// differently; tests/optim: relative parameter difference under 1e-6 after 20 steps).
//
// Works on sharded parameters like any libtorch optimizer: each rank updates its own shards.
// Floating parameters only (fp32, bf16, fp16, fp64); a group may mix devices and dtypes (the
// kernel runs once per device and dtype). Each step makes one scalar step-count tensor per
// parameter for the kernel (microseconds; the state keeps libtorch's integer count).
#pragma once

#include <torch/optim/adamw.h>

namespace fsdp {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // One fused update per parameter group (per device and dtype within it). Throws
  // InvalidArgument for a sparse gradient. Parameters without a gradient are skipped.
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace fsdp
