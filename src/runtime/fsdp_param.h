// Internal: one sharded parameter. Owns this rank's shard (original dtype) and a full tensor
// (compute dtype) whose StorageImpl persists across steps while its bytes come and go.
//
// Why a persistent StorageImpl: autograd keeps views of a weight it saved for backward
// (weight.t() in linear, slices of in_proj_weight in MultiheadAttention). Pointing the
// parameter at a new full tensor on every gather would keep each old one alive until backward.
// Instead the bytes are released after forward and the same storage is refilled before
// backward, so the saved views read the refilled values (FSDP2 does the same with
// untyped_storage().resize_(0)). See docs/libtorch.md.
//
// Invariant on grad(): while the parameter holds its shard, grad() is the sharded gradient
// (or undefined); while it holds the full tensor, grad() is autograd's full-shaped slot and the
// sharded gradient waits in a stash.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/sharding.h"
#include "runtime/accounting.h"

namespace torch::autograd {
struct Node;
}

namespace fsdp::detail {

class FsdpParam {
 public:
  // Shards `param` in place (set_data to this rank's rows). `compute_dtype` is the dtype of
  // the full tensor used in forward/backward.
  FsdpParam(at::Tensor param, int rank, int world, at::ScalarType compute_dtype);

  // The counters and pool the full tensor's bytes are accounted in (the tree's).
  void attach(Accounting* acct) { acct_ = acct; }

  const at::Tensor& param() const { return param_; }
  const std::vector<int64_t>& full_shape() const { return full_shape_; }
  const ShardRange& range(int rank) const { return ranges_.at(rank); }
  bool holds_full() const { return holds_full_; }
  bool requires_grad() const { return param_.requires_grad(); }
  at::ScalarType orig_dtype() const { return shard_.scalar_type(); }
  // Elements every rank contributes to a collective: ceil(d0 / world) rows, padded.
  int64_t padded_numel() const { return ranges_.front().rows_per_rank * row_numel_; }
  int64_t shard_bytes() const { return static_cast<int64_t>(shard_.nbytes()); }

  // Writes this rank's shard, cast to dst's dtype, into dst (padded_numel() elements; the
  // padding is zeroed).
  void copy_shard_to(const at::Tensor& dst) const;
  // Fills the full tensor from a gathered [world, padded_numel()] view (one row per rank),
  // allocating its bytes first.
  void copy_full_from(const at::Tensor& gathered);
  // Points the parameter at the full tensor (stashing the sharded grad) or back at the shard
  // (restoring it, and releasing the full tensor's bytes).
  void use_full();
  void use_shard();

  // Moves autograd's full gradient out of grad() and adds it to the unsharded gradient kept
  // across backwards while gradient sync is off (created in `dtype`, the reduce dtype, so
  // 16-bit gradients accumulate in 32 bits when the reduction does). No gradient: a no-op.
  void stash_full_grad(at::ScalarType dtype);
  // Moves autograd's full gradient out of grad(), adds the stashed unsharded gradient if any,
  // and writes the rows into a [world, padded_numel()] view in the reduce dtype, zeroing
  // padding. Without either gradient it zeroes the whole view and returns false.
  bool take_full_grad_into(const at::Tensor& dst);
  int64_t unsharded_grad_bytes() const {
    return unsharded_grad_.defined() ? static_cast<int64_t>(unsharded_grad_.nbytes()) : 0;
  }
  // Adds this rank's reduced rows (padded_numel() elements, any dtype) to the sharded grad.
  void accumulate_shard_grad(const at::Tensor& reduced);
  int64_t sharded_grad_bytes() const;

  // Whether autograd's accumulator for the current full tensor already carries our hook.
  bool hooked(const std::shared_ptr<torch::autograd::Node>& node) const;
  // Remembers `node` as hooked. Two references: the tensor itself holds its accumulator only
  // weakly, so between arming (pre-forward) and the first op that puts the node in a graph
  // nothing else keeps it; without the strong reference it would die and autograd would make
  // a fresh accumulator without our hook. release_hooked() (end of backward) drops the strong
  // one so the node can go with its graph; the weak one still answers hooked() while it lives.
  void set_hooked(std::shared_ptr<torch::autograd::Node> node);
  void release_hooked() { hooked_strong_.reset(); }

 private:
  void allocate_full();
  void release_full();

  at::Tensor param_;  // the user's Parameter: its TensorImpl never changes
  std::vector<int64_t> full_shape_;
  int64_t row_numel_;
  std::vector<ShardRange> ranges_;  // every rank's rows
  Accounting* acct_ = nullptr;
  at::Tensor shard_;  // [rows, ...] original dtype
  at::Tensor full_;   // full_shape_, compute dtype, storage bytes present only while gathered
  int64_t full_nbytes_;
  bool full_allocated_ = false;
  bool holds_full_ = false;
  at::Tensor grad_stash_;
  // Full-shaped gradient summed over backwards that ran without gradient sync.
  at::Tensor unsharded_grad_;
  std::weak_ptr<torch::autograd::Node> hooked_;
  std::shared_ptr<torch::autograd::Node> hooked_strong_;
};

}  // namespace fsdp::detail
