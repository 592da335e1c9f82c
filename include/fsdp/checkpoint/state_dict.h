// State dicts in memory, for models sharded by fully_shard and their optimizers: PyTorch's
// torch.distributed.checkpoint.state_dict (get/set_model_state_dict, get/set_optimizer_state_dict)
// for C++ programs. The sharded checkpoint files (checkpoint.h) and the safetensors export
// (export.h) are built on these.
//
// Two kinds:
// - sharded: name -> this rank's rows of the tensor, with the tensor's global shape and the
//   rows' offset; no communication. A parameter of a unit gives its shard (rows of dim 0 as
//   fully_shard split them); a parameter outside every unit (or ignored by fully_shard) and
//   every buffer gives the whole tensor, `replicated`.
// - full: name -> the whole tensor, gathered one tensor at a time over the group that shards it,
//   so that no rank ever holds more than one full tensor beyond what the caller keeps.
// Names: named_parameters()'s (the first name of a tensor registered under several, a tied
// embedding and head), then named_buffers(); optimizer state under "<parameter>#<state>"
// ("layers.0.fc1.weight#exp_avg", "...#step").
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "fsdp/runtime/sharded_tensor.h"

namespace fsdp {

// ShardedTensor (this rank's part of one tensor) is fully_shard's public shard view
// (fsdp/runtime/sharded_tensor.h).
using ShardedStateDict = NamedShards;
using FullStateDict = std::vector<std::pair<std::string, at::Tensor>>;

// --- model ---------------------------------------------------------------------------------------

// This rank's shards of every parameter, then every buffer (no communication). Throws
// InvalidArgument when a unit's parameters are gathered (between unshard() and reshard(), or
// mid-step).
ShardedStateDict get_model_state_dict(const torch::nn::Module& model);

struct FullStateDictOptions {
  // Only rank 0 receives the tensors (the others take part in the gathers).
  bool rank0_only = false;
  // The tensors handed over live on the CPU (gathered on the model's device, then copied).
  bool cpu_offload = true;
  // Convert floating tensors to this dtype (say kBFloat16 for a half-size export).
  std::optional<at::ScalarType> dtype;
  // Tensor parallelism: slices are gathered over the TP group into the full tensors too.
  tp::Layout tp;
  // The tensors to gather, by state dict name (null: all); the same on every rank. LoRA's
  // adapters alone, without gathering the frozen weights.
  std::function<bool(const std::string&)> filter;
};

// Collective over `world` (every rank of the model's groups calls it in the same order):
// gathers one tensor at a time, in state dict order, and hands each to `visit` (on rank 0 only
// with rank0_only), then frees it. A streaming full state dict: the export writes each tensor
// as it comes.
void for_each_full_tensor(
    const torch::nn::Module& model, const ProcessGroupPtr& world,
    const FullStateDictOptions& options,
    const std::function<void(const std::string& name, const at::Tensor& full)>& visit);
// The same, kept: every tensor whole (empty on ranks other than 0 with rank0_only).
FullStateDict get_full_model_state_dict(const torch::nn::Module& model,
                                        const ProcessGroupPtr& world,
                                        const FullStateDictOptions& options = {});

// Sets the model (sharded or not) from a state dict of either kind, at any world size and
// layout. Collective over `world`. Names and global shapes must match the model's both ways
// (a tied tensor's other names are accepted); dtypes are converted. Every rank checks and the
// ranks agree before any tensor changes: InvalidArgument naming the first difference.
// - sharded: each rank gives its rows (any rows: another world size's, another layout's, or
//   all of them on rank 0 and none elsewhere); each tensor is redistributed with one
//   all-gather unless every rank already has exactly the rows it needs.
// - full: each rank copies its rows from `full`; with rank0_only only rank 0's is read and each
//   tensor is broadcast in turn.
void set_model_state_dict(torch::nn::Module& model, const ShardedStateDict& state,
                          const ProcessGroupPtr& world);
void set_model_state_dict(torch::nn::Module& model, const FullStateDict& state,
                          const ProcessGroupPtr& world, bool rank0_only = false);
// The full form with options: `options.rank0_only` as above, and under tensor parallelism
// (`options.tp`) the full tensors of the unsplit model (what get_full_model_state_dict with the
// same layout gives, or a Hugging Face checkpoint's tensors), each rank keeping its slice's
// rows. `cpu_offload` and `dtype` are not read.
void set_model_state_dict(torch::nn::Module& model, const FullStateDict& state,
                          const ProcessGroupPtr& world, const FullStateDictOptions& options);

// --- optimizer ---------------------------------------------------------------------------------

// The optimizers whose state these functions read and write: torch::optim::Adam, AdamW
// (fsdp::FusedAdamW too), SGD, RMSprop and Adagrad. Each parameter's tensors ("exp_avg",
// "momentum_buffer", "square_avg", "sum", ...) are sharded like the parameter; its scalars
// ("step") are replicated 0-d tensors; "#param_groups" holds every param group's options (a
// replicated uint8 tensor, libtorch's own serialization of them). Another optimizer
// (LBFGS, whose state spans all parameters at once, or one of the program's own) is
// InvalidArgument naming its type.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);

// This rank's optimizer state, sharded like the model (no communication). Parameters the
// optimizer has no state for yet (before its first step) have no entries.
ShardedStateDict get_optimizer_state_dict(const torch::nn::Module& model,
                                          const torch::optim::Optimizer& optimizer);
// Sets the optimizer's state (and its param groups' options) from a state dict of
// get_optimizer_state_dict's form saved at any world size or layout; collective over `world`
// as set_model_state_dict. Parameters without entries get no state (as before a first step).
void set_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const ShardedStateDict& state, const ProcessGroupPtr& world);

}  // namespace fsdp
