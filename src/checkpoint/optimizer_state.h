// Internal: the per-parameter state of the optimizers a checkpoint can hold, as named tensors
// (each shaped like this rank's rows of its parameter) plus AdamW's step count.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <string>

namespace fsdp::detail {

// "none" (no optimizer), "adamw" (torch::optim::AdamW, fsdp::FusedAdamW) or "sgd"; anything
// else is CheckpointError naming the type.
std::string optimizer_kind(const torch::optim::Optimizer* optimizer);

struct ParamState {
  std::map<std::string, at::Tensor> tensors;  // "exp_avg", "exp_avg_sq", ... (defined ones)
  int64_t step = 0;                           // AdamW
};

// The state the optimizer holds for `param`, or nullopt before its first step.
std::optional<ParamState> param_state(const torch::optim::Optimizer& optimizer,
                                      const std::string& kind, const at::Tensor& param);
// The state tensor names `kind` may store.
const std::vector<std::string>& state_names(const std::string& kind);
// Replaces the optimizer's state for `param` (nullopt: none, as before a first step).
void set_param_state(torch::optim::Optimizer& optimizer, const std::string& kind,
                     const at::Tensor& param, const std::optional<ParamState>& state);

}  // namespace fsdp::detail
