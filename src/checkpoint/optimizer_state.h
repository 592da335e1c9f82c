// Internal: the per-parameter state of the optimizers state dicts can hold (state_dict.h), as
// named tensors shaped like the parameter's local rows plus integer scalars, and their param
// groups' options as libtorch serializes them.
#pragma once

#include <torch/optim/optimizer.h>

#include <map>
#include <optional>
#include <string>

namespace fsdp::detail {

struct ParamState {
  std::map<std::string, at::Tensor> tensors;  // "exp_avg", "square_avg", ... (defined ones)
  std::map<std::string, int64_t> scalars;     // "step"
};

// "adam", "adamw" (fsdp::FusedAdamW too), "sgd", "rmsprop" or "adagrad"; anything else is
// InvalidArgument naming the type.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

// The state the optimizer holds for `param`, or nullopt before its first step.
std::optional<ParamState> read_param_state(const torch::optim::Optimizer& optimizer,
                                           const std::string& kind, const at::Tensor& param);
// Replaces the optimizer's state for `param` (nullopt: none, as before a first step). A field
// the kind does not have is InvalidArgument naming it.
void write_param_state(torch::optim::Optimizer& optimizer, const std::string& kind,
                       const at::Tensor& param, const std::optional<ParamState>& state);

// A param group's options (lr, betas, ...) as bytes (libtorch's serialization of them), and
// back into a group of the same optimizer type.
at::Tensor group_options_bytes(const torch::optim::OptimizerParamGroup& group);
void restore_group_options(torch::optim::OptimizerParamGroup& group, const at::Tensor& bytes);

}  // namespace fsdp::detail
