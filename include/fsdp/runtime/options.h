// Options of fully_shard (fully_shard.h).
#pragma once

#include <optional>

#include "fsdp/mixed_precision.h"

namespace fsdp {

struct FullyShardOptions {
  MixedPrecisionPolicy mp_policy;
  // Free the full parameters after forward and gather them again for backward. Unset: true,
  // except for the root unit, which keeps them (it is the first to run backward).
  std::optional<bool> reshard_after_forward;
  // Activation checkpointing: the unit's forward keeps only its inputs and records no graph;
  // backward gathers the parameters, recomputes the forward (with the random-number state of
  // the first run, so dropout draws the same mask) and backpropagates through it. Trades one
  // more forward per step for the activations of the unit. Needs the unit to be called through
  // its fsdp::Unit, and its forward to return a Tensor, a vector of Tensors or a tuple of
  // Tensors.
  bool activation_checkpointing = false;
};

}  // namespace fsdp
