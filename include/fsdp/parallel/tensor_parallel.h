// Tensor parallelism (Megatron-LM's, as PyTorch's parallelize_module does it with DTensor):
// the pieces a model needs to split its matmuls over a tensor-parallel (TP) group, and the loss
// over vocabulary shards (TorchTitan's loss_parallel). No DTensor: a TP parameter is a plain
// tensor holding this rank's slice of the full one, and its TpSlice says which.
//
//   column-parallel linear (q, k, v, gate, up; the head): weight rows [out / tp, in] sliced,
//     y_local = copy_to_tp(x) W_local^T: the input is whole on every TP rank, the output is
//     this rank's columns. copy_to_tp: identity forward, all-reduce of the gradient backward.
//   row-parallel linear (o, down): weight columns [out, in / tp] sliced, y = reduce_from_tp(
//     x_local W_local^T) + bias: reduce_from_tp: all-reduce forward, identity backward.
//   vocabulary-parallel embedding: rows [vocab / tp, hidden]; a token outside this rank's rows
//     looks up zeros; reduce_from_tp sums the ranks' lookups.
//   vocabulary-parallel cross-entropy: the logits stay [tokens, vocab / tp] on each rank; the
//     max, the sum of exponentials and the target's logit are combined over the group (a few
//     numbers per token), so the full logits never exist on one rank.
//
// Slices follow torch.chunk (and DTensor's Shard, and fully_shard's rows): chunks of
// ceil(n / tp), the last ones shorter or empty, so a vocabulary of 1001 over 2 ranks is 501 +
// 500. Every function here is collective over `tp` (every rank of the group calls it in the
// same order); the group must outlive the autograd graph that holds its operations.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::tp {

// The part of a dimension of size `full` that TP rank `rank` of `size` holds.
struct Chunk {
  int64_t offset = 0;
  int64_t length = 0;
};
Chunk chunk_of(int64_t full, int size, int rank);

// Which slice of a full tensor a TP parameter holds: along `dim` (0: rows, 1: columns), the
// chunk of this rank. `full` is the full tensor's shape.
struct TpSlice {
  int64_t dim = 0;
  Chunk chunk;
  std::vector<int64_t> full;
};

// A model's tensor-parallel layout, for checkpoints, exports and norms: the group, and the
// slice each sliced parameter holds by its state-dict name (optimizer state "<name>#<state>"
// follows its parameter). Parameters absent are whole and equal on every rank of the group.
struct Layout {
  ProcessGroupPtr group;
  std::map<std::string, TpSlice> slices;
  // The ranks whose slices have this rank's shapes (DeviceMesh::dp_group()): loads agree on
  // shapes within it. Null: every rank of the model's world.
  ProcessGroupPtr dp;

  bool active() const { return group != nullptr && group->size() > 1; }
  // The slice of a parameter, or of the parameter of an optimizer state entry; null for one
  // that is whole (or without tensor parallelism).
  const TpSlice* slice_of(const std::string& name) const;
};

// The full tensor along `dim` from every rank's chunk of it (forward only: no gradient); `full`
// is the dimension's full size. Collective over `tp`.
at::Tensor gather_dim(const at::Tensor& local, int64_t dim, int64_t full,
                      const ProcessGroupPtr& tp);

// Forward: x (a view of the caller's tensor). Backward: the gradient summed over `tp`.
// Before a column-parallel matmul whose input is whole on every rank. A null group or a group
// of one rank returns x.
at::Tensor copy_to_tp(const at::Tensor& x, const ProcessGroupPtr& tp);

// Forward: x summed over `tp` (a new tensor). Backward: the gradient as it is. After a
// row-parallel matmul (and a vocabulary-parallel lookup).
at::Tensor reduce_from_tp(const at::Tensor& x, const ProcessGroupPtr& tp);

// Sequence parallelism (Megatron's, TorchTitan's SequenceParallel): between the split matmuls
// the activations [batch, seq, hidden] are split over the sequence (dim 1) instead of whole on
// every rank, so norms, residuals and their saved activations cost 1/tp each. The sequence must
// divide by the group's size (InvalidArgument naming both otherwise).
// Forward: the whole sequence from every rank's chunk (all-gather); backward: the gradient
// summed over the group and cut to this rank's chunk (reduce-scatter). Before a column-parallel
// matmul, in place of copy_to_tp.
at::Tensor gather_sequence(const at::Tensor& x, const ProcessGroupPtr& tp);
// Forward: x summed over the group, this rank's chunk of the sequence (reduce-scatter);
// backward: the gradient's chunks gathered (all-gather). After a row-parallel matmul, in place
// of reduce_from_tp.
at::Tensor reduce_scatter_sequence(const at::Tensor& x, const ProcessGroupPtr& tp);

// The full last dimension from every rank's chunk of it (forward only: no gradient), for
// logits a caller wants whole. `full` is the full size of the last dimension.
at::Tensor gather_last_dim(const at::Tensor& local, int64_t full, const ProcessGroupPtr& tp);

// The mean cross-entropy of `targets` [N] (int64; `ignore_index` entries not counted) under
// logits whose last dimension is sharded over `tp`: `local` [N, chunk] holds the columns
// [vocab_offset, vocab_offset + chunk) of the full logits. Computed in fp32 whatever local's
// dtype; the same value on every rank of `tp`, equal to cross_entropy on the full logits. The
// gradient flows into `local` only (each rank's columns). Throws InvalidArgument for shapes
// that do not match (named).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local, const at::Tensor& targets,
                                        int64_t vocab_offset, int64_t vocab,
                                        const ProcessGroupPtr& tp, int64_t ignore_index = -100);

}  // namespace fsdp::tp
