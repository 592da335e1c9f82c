// Internal: what fsdp::Unit<Holder> (fully_shard.h) calls around a module's forward, implemented
// by the sharding runtime (src/runtime/fully_shard.cpp). Not for direct use.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

#include "fsdp/comm_stats.h"
#include "fsdp/fully_shard_options.h"
#include "fsdp/memory_stats.h"
#include "fsdp/process_group.h"

namespace fsdp {
namespace detail {
class UnitState;

// The state fully_shard attached to `module`, or null.
std::shared_ptr<UnitState> find_unit_state(const torch::nn::Module* module);
// `replicate` (may be null): the group the unit's reduced gradient shards are all-reduced over
// (hybrid sharding, device_mesh.h).
std::shared_ptr<UnitState> create_unit_state(const std::shared_ptr<torch::nn::Module>& module,
                                             ProcessGroupPtr pg, ProcessGroupPtr replicate,
                                             FullyShardOptions options);
void pre_forward(UnitState& state);
at::Tensor cast_forward_input(UnitState& state, const at::Tensor& input);
// Casts to output_dtype and hooks the pre-backward; may replace `output`.
void post_forward_output(UnitState& state, at::Tensor& output);
void post_forward(UnitState& state);
void unshard(UnitState& state);
void reshard(UnitState& state);
MemoryStats memory_stats(const UnitState& state);
CommStats comm_stats(const UnitState& state);
void set_requires_gradient_sync(UnitState& state, bool sync, bool recurse);
// Whether the next forward of the unit runs checkpointed (the option is on and grad mode too).
bool checkpoints_forward(const UnitState& state);

// The module's forward on these tensor arguments (in order), its outputs as a list.
using ForwardFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
// Runs `forward` checkpointed for `state`'s unit (src/runtime/checkpoint.cpp); the outputs
// carry the recompute as their gradient function.
std::vector<at::Tensor> run_checkpointed(UnitState& state, const std::vector<at::Tensor>& inputs,
                                         ForwardFn forward);

}  // namespace detail

// Throws InvalidArgument: `what` was called on a module fully_shard was not applied to.
[[noreturn]] void throw_not_sharded(const char* what);
// Throws InvalidArgument: a unit with activation checkpointing whose forward returns
// `output_type`, which is not a Tensor, a vector of Tensors or a tuple of Tensors.
[[noreturn]] void throw_not_checkpointable(const char* output_type);

}  // namespace fsdp
