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
// Gradients: grad() is always the sharded gradient (or undefined), whether the parameter holds
// its shard or the full tensor, so that whatever a user does to grad() (zero_grad, set to none,
// an edit in place) means what it means without FSDP. Autograd's full gradient never reaches
// grad(): a pre-hook on the parameter's gradient accumulator takes it (capture_full_grad) and
// hands the accumulator nothing, so it accumulates nothing (FSDP2 keeps the two apart by
// registering a different Parameter object while unsharded; here the Tensor stays the same).
//
// The public view of a parameter (fsdp/runtime/sharded_tensor.h: its rows, their offset, the
// global shape, the groups) is made here (view()), and its shard's storage carries the same
// facts (ShardMark), so that a bare tensor can be recognised.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/layout.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/sharded_tensor.h"

namespace torch::autograd {
struct Node;
}

namespace fsdp::detail {

// What a shard's storage carries besides its bytes: the unit that made it and the rows it
// holds of which tensor over which groups. A property of the tensor itself: no map of every
// sharded parameter exists, yet a module sharded again inside a sharded one is caught
// (fully_shard.cpp) and a bare parameter tells what it is a shard of (fsdp::shard_of).
struct ShardMark {
  std::string owner;  // the unit, for messages
  std::vector<int64_t> full_shape;
  int64_t row_offset = 0;
  std::weak_ptr<ProcessGroup> shard_group, replicate_group;
  int replica = 0;
  int shard_dim = 0;  // row_offset is then the chunk's offset in that dim
};
// The mark of `t`'s storage (a shard's, or a gathered full tensor's), or null when no FsdpParam
// made it.
const ShardMark* shard_mark(const at::Tensor& t);

// The full tensor's storage holds its bytes through this (fsdp_param.cpp): the bytes a gather
// attached, and the mark, so a parameter tells what it is while gathered too.
struct FullBytes;

class FsdpParam {
 public:
  // Shards `param` in place (set_data to this rank's rows of `shard`'s sharding; `replicate`
  // is the hybrid replicate group or null). `compute_dtype` is the dtype of the full tensor used
  // in forward/backward; `owner` names the unit, for messages. With `offload` the shard (and so
  // the parameter between gathers, its gradient and the optimizer's state) is in host memory
  // and the full tensor on the group's device.
  // `shard_dim`: the dim sharded (FullyShardOptions::shard_placement_fn); other than 0 it must
  // divide evenly by the group's size (checked by fully_shard).
  FsdpParam(at::Tensor param, const ProcessGroupPtr& shard, const ProcessGroupPtr& replicate,
            at::ScalarType compute_dtype, const std::string& owner,
            const std::optional<CPUOffloadPolicy>& offload = std::nullopt, int shard_dim = 0);
  // Releases the full tensor's bytes: autograd's saved views may keep its storage longer.
  ~FsdpParam();
  FsdpParam(FsdpParam&&) noexcept;
  FsdpParam& operator=(FsdpParam&&) = delete;

  const at::Tensor& param() const { return param_; }
  const std::vector<int64_t>& full_shape() const { return full_shape_; }
  // The sharded dim's extent and the elements per index of it: the layout (layout.h) deals
  // that dim's indices to ranks as it deals rows.
  ParamShape shape() const { return {full_shape_[shard_dim_], row_numel_}; }
  int shard_dim() const { return shard_dim_; }
  const ShardRange& range(int rank) const { return ranges_.at(rank); }
  int world() const { return static_cast<int>(ranges_.size()); }
  bool holds_full() const { return holds_full_; }
  bool requires_grad() const { return param_.requires_grad(); }
  // Elements every rank contributes to a collective: ceil(d0 / world) rows, padded.
  int64_t padded_numel() const { return shape().padded_numel(world()); }
  int64_t shard_bytes() const { return static_cast<int64_t>(shard_.nbytes()); }
  // This rank's shard (the same memory as param() holds while sharded).
  const at::Tensor& shard() const { return shard_; }
  // The public view: `local` is the parameter itself, holding this rank's rows while sharded.
  ShardedTensor view() const;

  // The full tensor's storage comes and goes (see the file comment). Its bytes: how many, on
  // which device, from which allocator when no pool serves them.
  int64_t full_nbytes() const { return full_nbytes_; }
  c10::Device device() const { return full_.device(); }
  at::Allocator* full_allocator() const;
  bool full_allocated() const { return full_allocated_; }
  // Gives the full tensor `bytes` (full_nbytes() of them, contents undefined) and returns it, for
  // a caller that fills every element (the all-gather's copy-out).
  const at::Tensor& attach_full(at::DataPtr bytes);
  // The full tensor (bytes present only between attach_full and release_full).
  const at::Tensor& full() const { return full_; }
  // Drops the full tensor's bytes (their DataPtr returns them where they came from); views
  // autograd saved keep the (now empty) storage.
  void release_full();
  // Points the parameter at the full tensor, or back at the shard. grad() is untouched.
  void use_full();
  void use_shard();
  // A parameter pointed at other memory while sharded (Module::to after fully_shard moves every
  // parameter of a module tree, shards included; a load that assigns): its values become the
  // shard's and it holds the shard again (FSDP2's reset_sharded_param). A tensor of another
  // shape than the shard's is refused (InvalidArgument naming the unit).
  void adopt_replaced_data();

  // Autograd's full gradient, from the accumulator's pre-hook: kept until this backward's
  // post-backward (added to when a parameter is used more than once).
  void capture_full_grad(const at::Tensor& grad);
  // Whether a full gradient waits for a reduction (this backward's, or kept by backwards
  // without gradient sync).
  bool has_full_grad() const { return full_grad_.defined() || kept_grad_.defined(); }
  // Backward without gradient sync: this backward's full gradient joins the kept one, in
  // `dtype` (the reduce dtype, so that 16-bit gradients accumulate in 32 bits when the
  // reduction does).
  void keep_full_grad(at::ScalarType dtype);
  // The full gradient to reduce (the kept one and this backward's, summed; full shape, their
  // dtype), undefined when there is none, and drops them.
  at::Tensor take_full_grad();
  // Drops this backward's full gradient (a failed backward's, or a parameter no longer
  // trainable); gradients kept by earlier backwards stay.
  void drop_full_grad() { full_grad_ = at::Tensor(); }
  int64_t kept_grad_bytes() const {
    return kept_grad_.defined() ? static_cast<int64_t>(kept_grad_.nbytes()) : 0;
  }
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
  at::Tensor param_;  // the user's Parameter: its TensorImpl never changes
  ProcessGroupPtr shard_group_, replicate_group_;
  std::vector<int64_t> full_shape_;
  int64_t row_numel_;  // elements per index of the sharded dim
  int shard_dim_ = 0;
  std::vector<ShardRange> ranges_;  // every rank's indices of the sharded dim
  at::Tensor shard_;                // [rows, ...] original dtype
  at::Tensor full_;  // full_shape_, compute dtype, storage bytes present only while gathered
  int64_t full_nbytes_;
  std::unique_ptr<FullBytes> full_bytes_;
  bool full_allocated_ = false;
  bool holds_full_ = false;
  // This backward's full gradient, and the sum of those of backwards without gradient sync.
  at::Tensor full_grad_;
  bool owns_full_grad_ = false;  // full_grad_ is our tensor, not autograd's
  at::Tensor kept_grad_;
  std::weak_ptr<torch::autograd::Node> hooked_;
  std::shared_ptr<torch::autograd::Node> hooked_strong_;
};

}  // namespace fsdp::detail
