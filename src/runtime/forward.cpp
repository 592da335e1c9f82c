// run_forward: the one entry point of every forward through an fsdp::Unit (fully_shard.h).
#include <fmt/format.h>

#include "fsdp/runtime/fully_shard.h"
#include "runtime/activation_checkpoint.h"
#include "runtime/unit_state.h"
#include "util/check.h"

namespace fsdp::detail {

std::vector<at::Tensor> run_forward(UnitState& state, std::vector<at::Tensor> inputs,
                                    const ForwardFn& fn, const ForwardSpec& spec) {
  return run_forward(state, std::move(inputs), fn, spec, nullptr);
}

std::vector<at::Tensor> run_forward(UnitState& state, std::vector<at::Tensor> inputs,
                                    const ForwardFn& fn, const ForwardSpec& spec,
                                    const torch::nn::Module* member) {
  if (state.checkpoints_forward()) {
    FSDP_CHECK_ARG(spec.tensor_outputs,
                   "fsdp: activation_checkpointing needs the unit's forward to return a Tensor, "
                   "a std::vector<Tensor> or a std::tuple of Tensors; {} returns {}",
                   state.describe(), c10::demangle(spec.output_type));
    FSDP_CHECK_ARG(spec.replayable,
                   "fsdp: activation_checkpointing needs arguments it can keep for the "
                   "recompute; the arguments of {}'s forward cannot be copied",
                   state.describe());
  }
  std::vector<at::Tensor> outputs;
  try {
    state.pre_forward();
    for (auto& x : inputs) x = state.prepare_input(x);
    outputs = state.checkpoints_forward() ? run_checkpointed(state, inputs, fn) : fn(inputs);
    for (auto& o : outputs) state.prepare_output(o);
    // Outputs that are not tensors cannot be hooked: the unit keeps its parameters until the
    // end of backward instead of gathering them again.
    state.post_forward(/*hooked_outputs=*/spec.tensor_outputs, member);
  } catch (...) {
    // A throwing forward (a shape error, an out-of-memory the caller catches to retry with a
    // smaller batch) leaves nothing gathered; the root's resets the tree (tree.h).
    try {
      state.forward_failed();
    } catch (...) {
      // The forward's own error is the one to report.
    }
    throw;
  }
  return outputs;
}

}  // namespace fsdp::detail
