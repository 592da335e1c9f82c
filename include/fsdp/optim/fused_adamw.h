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
// device, dtype and count for the kernel (one in a normal run; the state keeps libtorch's
// integer count).
#pragma once

#include <torch/optim/adamw.h>

namespace fsdp {

class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  // One fused update per parameter group (per device and dtype within it). Throws
  // InvalidArgument for a sparse gradient. Parameters without a gradient are skipped.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Optimizer-state offload, on its own (FSDP2's CPUOffloadPolicy moves the parameters too, all
  // or nothing; ZeRO-Offload's split): the moments of parameters that live on a device are kept
  // in host memory, and each step copies those parameters (this rank's shards) and their
  // gradients to the host (staged in pinned memory with `pin_memory`: asynchronous copies and
  // one wait per step), updates them there with the fused CPU kernel (libtorch's intra-op
  // threads), and copies the parameters back asynchronously. Device memory saved: both
  // moments, 8 bytes per fp32 parameter; cost: the copies (host to host where the parameters
  // are on the host: the same path, for machines without a GPU). State created on a device
  // (loaded from a checkpoint beside its parameter) moves to the host at the next step.
  void set_state_offload(bool on, bool pin_memory = true) {
    offload_state_ = on;
    pin_memory_ = pin_memory;
  }
  bool state_offload() const { return offload_state_; }

 private:
  bool offload_state_ = false;
  bool pin_memory_ = true;
};

}  // namespace fsdp
