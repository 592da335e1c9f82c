// Internal: activation checkpointing of one unit's forward
// (FullyShardOptions::activation_checkpointing), run by run_forward (forward.cpp).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "fsdp/runtime/fully_shard.h"

namespace fsdp::detail {

// Runs `forward` checkpointed for `state`'s unit; the outputs carry the recompute as their
// gradient function.
std::vector<at::Tensor> run_checkpointed(UnitState& state, const std::vector<at::Tensor>& inputs,
                                         const ForwardFn& forward);

}  // namespace fsdp::detail
