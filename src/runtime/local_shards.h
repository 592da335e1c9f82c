// Internal: what this rank holds of each parameter of a model, for checkpoints. Sharded
// parameters come from their unit's FsdpParam; parameters outside every unit are replicated.
#pragma once

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::detail {

struct LocalShard {
  std::string name;   // the first name of the tensor in model.named_parameters()
  at::Tensor tensor;  // the parameter itself: this rank's rows of dim 0
  std::vector<int64_t> full_shape;
  int64_t row_begin = 0, row_end = 0;  // rows of dim 0 held here (a 0-d tensor: one row)
  bool replicated = false;             // outside every unit: every rank holds every row
  // The group the rows are sharded over (null when replicated), and this rank's replica under
  // hybrid sharding (0 without): replicas hold the same rows, so only replica 0 writes them.
  ProcessGroupPtr shard_group;
  int replica = 0;
};

// Each unique parameter of `model` once, in named_parameters() order, found through the module
// tree. Throws InvalidArgument when a unit's parameters are gathered (between unshard() and
// reshard(), or mid-step), unless `allow_gathered` (callers that read gradients only).
std::vector<LocalShard> local_shards(const torch::nn::Module& model, bool allow_gathered = false);

}  // namespace fsdp::detail
