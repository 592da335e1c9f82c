// The public view of what this rank holds of a sharded model's parameters: for each tensor, its
// rows on this rank, the global shape, where the rows start, and the groups that shard and
// replicate it. fully_shard's runtime produces it (src/runtime/shard_view.cpp); state dicts,
// checkpoints, optimizer state, clipping and export read parameters only through it.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp {

// This rank's part of one tensor (of a model, a state dict, an optimizer's state).
struct ShardedTensor {
  // This rank's rows of dim 0 (a 0-d tensor counts as one row). From the model: the live
  // tensor itself (a parameter's shard, a buffer), not a copy.
  at::Tensor local;
  std::vector<int64_t> global_shape;
  int64_t row_offset = 0;   // the first row of `local` in the whole tensor
  bool replicated = false;  // every rank holds the whole tensor
  // The group the rows are sharded over (null when replicated), and this rank's replica under
  // hybrid sharding (0 without): replicas hold the same rows; replica 0 is the one that writes.
  ProcessGroupPtr shard_group;
  int replica = 0;
  // The group the replicas of these rows span (null without hybrid sharding): gradients of
  // `local` are averaged over it, so norms must not be combined over it.
  ProcessGroupPtr replicate_group;
  // The dim the tensor is sharded on (FullyShardOptions::shard_placement_fn). 0: `local` holds
  // rows [row_offset, row_offset + rows()) of dim 0. Otherwise `local` holds every row and the
  // chunk of this dim at index shard_group->rank() of shard_group->size() equal chunks
  // (row_offset 0); readers that work on rows convert (checkpoint/state_dict.h).
  int shard_dim = 0;

  int64_t rows() const { return local.dim() == 0 ? 1 : local.size(0); }
};
using NamedShards = std::vector<std::pair<std::string, ShardedTensor>>;

// Each unique parameter of `model` once, in named_parameters() order under its first name (a
// tied tensor once), found through the module tree: a parameter of a fully_shard unit as its
// shard (`local` is the parameter itself, holding this rank's rows), any other parameter
// `replicated` (every rank holds it whole). No communication. Throws InvalidArgument when a
// unit's parameters are gathered now (between unshard() and reshard(), or mid-step): its
// parameters hold full tensors then, not rows.
NamedShards parameter_shards(const torch::nn::Module& model);

// The same for a caller that reads only gradients (which are sharded at every moment), so
// gathered parameters are accepted: `local` is the parameter, whatever it holds now, and the
// rows describe its gradient.
NamedShards parameter_gradient_shards(const torch::nn::Module& model);

// What `param` is a shard of, read from the tensor itself (its storage is marked, whether it
// holds its shard or, gathered, the full tensor): the global shape, this rank's row offset and
// the groups. nullopt when no fully_shard unit shards it. `local` is `param` as it is: while
// gathered it holds the full tensor, so rows() is not this rank's then.
std::optional<ShardedTensor> shard_of(const at::Tensor& param);

}  // namespace fsdp
