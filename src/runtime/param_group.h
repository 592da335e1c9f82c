// Internal: the parameters of one fully_shard call and their collectives: one all-gather to
// unshard them all (copy-in, all-gather, copy-out) and one reduce-scatter for their gradients
// (copy-in, reduce-scatter, accumulate into the sharded grads), and with hybrid sharding one
// all-reduce of the reduced shard across replicas. FSDP2's FSDPParamGroup.
//
// Its state is where the parameters are (sharded, gathering, full) and the buffers of the
// collectives in flight; when to move them is the unit's decision (UnitState), the tree's
// buffers and counters are passed in (Accounting).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/device_mesh.h"
#include "fsdp/runtime/mixed_precision.h"
#include "runtime/accounting.h"
#include "runtime/fsdp_param.h"
#include "tools/range.h"

namespace fsdp::detail {

// How a post-backward reduces, from the unit's settings.
struct ReduceSettings {
  bool reduce = true;        // set_requires_gradient_sync: else keep full gradients
  bool all_reduce = true;    // set_requires_all_reduce (hybrid): else keep the reduced shard
  bool if_unused = false;    // set_reduce_scatter_unused_params: zeros when nothing got a grad
  double divide_factor = 0;  // set_gradient_divide_factor; 0: the number of ranks
};

class ParamGroup {
 public:
  // `mesh.shard` shards the parameters; `mesh.replicate` (null without hybrid sharding) is the
  // group their reduced gradient shards are all-reduced over. `post_forward` (null unless
  // reshard_after_forward_ranks is set) is the smaller group this rank's parameters stay
  // sharded over between forward and backward.
  // `owner` names the unit, for messages.
  ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, const DeviceMesh& mesh,
             MixedPrecisionPolicy mp, ProcessGroupPtr post_forward, const std::string& owner);

  // Issues the all-gather unless the parameters are full or a gather is in flight.
  void unshard_async(Accounting& acct);
  // Completes an issued gather (issuing one if needed) and points parameters at full tensors.
  void wait_unshard(Accounting& acct);
  // Points parameters back at their shards and frees the full tensors (waits out a gather
  // still in flight first).
  void reshard(Accounting& acct);
  // After forward with reshard_after_forward_ranks: keeps this rank's rows of the post-forward
  // group's sharding and frees the full tensors; the next gather runs within that group.
  void reshard_to_post_forward(Accounting& acct);
  bool is_full() const { return state_ == State::kFull; }
  bool is_sharded() const { return state_ == State::kSharded; }

  // Hooks autograd's gradient accumulators of the current full parameters that require a
  // gradient: the full gradient goes to the FsdpParam (the accumulator gets none) and
  // on_grad(index) runs. Rebuilds the reduce layout when the set of trainable parameters
  // changed since the last call. Returns how many parameters take a gradient (0 when nothing is
  // communicated: one rank without dtype changes, where autograd accumulates into grad()).
  size_t arm_grad_hooks(const std::function<void(size_t, const at::Tensor&)>& on_grad);
  // With settings.reduce: copies the full gradients into a buffer, drops them, reshards,
  // issues the reduce-scatter. Without: keeps the full gradients for a later reducing backward
  // (FSDP2's set_requires_gradient_sync(False)) and reshards (unless `reshard` is false). A
  // no-op when the parameters were never gathered for backward and nothing is kept. Returns
  // whether a reduce-scatter is now in flight. The caller runs it at most once per backward.
  bool post_backward(Accounting& acct, const ReduceSettings& settings, bool reshard);
  // Waits for the reduce-scatter in flight (if any) and, with hybrid sharding, for the
  // all-reduce across replicas after it (issuing it if needed), adds each rank's rows into the
  // sharded grads and frees the buffers.
  void finish_reduce(Accounting& acct);
  // Hybrid sharding: waits for the reduce-scatter in flight and issues the all-reduce of its
  // result across replicas, without waiting for it (finish_reduce does).
  void start_all_reduce(Accounting& acct);
  bool reduce_scatter_in_flight() const { return reduce_work_ && !all_reduce_issued_; }
  bool reduction_in_flight() const { return reduce_out_.defined(); }
  bool hybrid() const { return replicate_ != nullptr; }
  // Drops the hooked accumulators of this backward (after finish_reduce).
  void end_backward();
  // A failed step: drops full gradients not yet reduced and the hooked accumulators.
  void drop_backward();

  const std::vector<FsdpParam>& params() const { return params_; }
  std::vector<FsdpParam>& params() { return params_; }
  const ProcessGroupPtr& pg() const { return pg_; }
  const ProcessGroupPtr& replicate() const { return replicate_; }
  // Bytes the last reduce-scatter's input carried (the reduce layout times the ranks).
  int64_t reduce_layout_elements() const { return reduce_layout_.total; }

  // Profiler range names carrying the unit's name in the root (set by the root's lazy init).
  void set_unit_name(const std::string& name) { range_names_ = UnitRangeNames(name); }
  const UnitRangeNames& range_names() const { return range_names_; }

 private:
  enum class State { kSharded, kGathering, kFull };
  // After a gather completed: returns its buffers to the pool.
  void release_gather_buffers(Accounting& acct);
  std::vector<ParamShape> shapes() const;
  at::TensorOptions buffer_options(at::ScalarType dtype) const;

  ProcessGroupPtr pg_;
  ProcessGroupPtr replicate_;
  at::ScalarType compute_dtype_;
  at::ScalarType reduce_dtype_;
  std::vector<FsdpParam> params_;
  FlatLayout gather_layout_, reduce_layout_;
  std::vector<bool> trainable_;  // what the reduce layout was built for
  bool passthrough_ = false;     // world size 1 without dtype changes: nothing to move
  UnitRangeNames range_names_;

  State state_ = State::kSharded;
  WorkPtr gather_work_;
  bool gathering_small_ = false;  // the gather in flight runs within post_forward_
  at::Tensor gather_in_, gather_out_;

  // reshard_after_forward_ranks: the smaller group, its layout, and this rank's rows of it
  // kept between forward and backward (undefined when not kept).
  ProcessGroupPtr post_forward_;
  std::vector<ParamShape> post_forward_shapes_;
  FlatLayout post_forward_layout_;
  at::Tensor post_forward_shard_;

  WorkPtr reduce_work_;  // the reduce-scatter, then (hybrid) the all-reduce after it
  bool all_reduce_issued_ = false;
  bool all_reduce_wanted_ = true;
  double divide_factor_ = 0;
  at::Tensor reduce_in_, reduce_out_;
  std::vector<bool> reduced_had_grad_;
  // Hybrid sharding with set_requires_all_reduce(false): reduced shards kept for the next
  // all-reduce, [reduce layout] in the reduce dtype.
  at::Tensor pending_reduced_;
  std::vector<bool> pending_had_grad_;
};

}  // namespace fsdp::detail
