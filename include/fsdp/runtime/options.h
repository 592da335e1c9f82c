// Options of fully_shard (fully_shard.h), FSDP2's keyword arguments.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/runtime/mixed_precision.h"

namespace fsdp {

// FSDP2's CPUOffloadPolicy: the sharded parameters, their gradients (and so the optimizer's
// state and step) live in host memory; each all-gather first copies this rank's shards to the
// device, and each reduced gradient shard is copied back to the host. The device then holds
// only gathered parameters, communication buffers and activations.
struct CPUOffloadPolicy {
  // Pinned (page-locked) host memory, so that the copies to the device run asynchronously;
  // only where the device is a GPU (on the CPU there is nothing to pin for).
  bool pin_memory = true;
};

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
  // Tensors. The recompute sets libtorch's global generators and puts them back, as PyTorch's
  // checkpoint does: thread ranks of one process (make_local_groups) share those generators,
  // so another rank drawing random numbers meanwhile (seeding and building a model) may be
  // disturbed; separate processes are not affected.
  bool activation_checkpointing = false;
  // FSDP2's reshard_after_forward as an int (ZeRO++'s hpZ): after forward, keep each parameter
  // sharded over groups of this many consecutive ranks instead of freeing it, so that the
  // backward's all-gather stays inside such a group (a machine) at the price of 1/ranks of the
  // unit's full parameters per rank. 0: off. Otherwise a divisor of the shard group's size
  // other than 1 and the size itself; fully_shard then splits the group (a collective).
  // (Declared after 0.1.0's members, so that 0.1.0's positional
  // FullyShardOptions{mp, reshard, checkpointing} keeps its meaning.)
  int reshard_after_forward_ranks = 0;
  // Parameters of the module left as they are: not sharded, not gathered, their gradients not
  // reduced (FSDP2's ignored_params). Each rank keeps and trains its own copy.
  std::vector<at::Tensor> ignored_params = {};
  // Unset: the shards live on the group's device (the parameters' own). Set: in host memory
  // (CPUOffloadPolicy). Parameters may then start on the CPU or on the device. On a machine
  // without a GPU the host is the device: the same copies run (host to host), so the offload
  // path is exercised and checked there too.
  std::optional<CPUOffloadPolicy> offload_policy = std::nullopt;
  // FSDP2's shard_placement_fn: the dim each parameter is sharded on, given its name in the
  // module fully_shard shards (for a list of modules: in its member, so two members' "weight"
  // look alike: tell them by the tensor) and the tensor; nullopt (or no function): 0. A negative
  // dim counts from the end. A dim other than 0 must divide evenly by the shard group's size
  // (FSDP2's rule too: no padding there); fully_shard refuses otherwise, naming the parameter. Each
  // rank then holds a contiguous chunk of that dim (Shard(1) of a [out, in] weight: [out, in /
  // world]), which is what parameters(), the optimizer and checkpoints see; gathers and reductions
  // move the same bytes as Shard(0). For experts or weights whose dim 0 is small, or to keep a
  // TP-shaped dim whole.
  std::function<std::optional<int64_t>(const std::string& name, const at::Tensor& param)>
      shard_placement_fn = nullptr;
};

}  // namespace fsdp
