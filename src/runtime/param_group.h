// Internal: the parameters of one fully_shard call and their collectives: one all-gather to
// unshard them all (copy-in, all-gather, copy-out) and one reduce-scatter for their gradients
// (copy-in, reduce-scatter, accumulate into the sharded grads). FSDP2's FSDPParamGroup.
// Its state is where the parameters are (sharded, gathering, full) and the buffers of the
// collectives in flight; when to move them is the unit's decision (UnitState), and the state of
// one backward lives there too.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/mixed_precision.h"
#include "fsdp/process_group.h"
#include "profile/range.h"
#include "runtime/accounting.h"
#include "runtime/collectives.h"
#include "runtime/fsdp_param.h"

namespace fsdp::detail {

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  // `pg` shards the parameters; `replicate` (null without hybrid sharding) is the group their
  // reduced gradient shards are all-reduced over, averaged, after each reduce-scatter.
  ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, ProcessGroupPtr pg,
             ProcessGroupPtr replicate, MixedPrecisionPolicy mp);

  // The tree's counters and buffer pool, which every later call uses.
  void attach(Accounting* acct);

  // Issues the all-gather unless the parameters are full or a gather is in flight.
  void unshard_async();
  // Completes an issued gather (issuing one if needed) and points parameters at full tensors.
  void wait_unshard();
  // Points parameters back at their shards and frees the full tensors (waits out a gather
  // still in flight first).
  void reshard();

  // Hooks autograd's gradient accumulators of the current full parameters:
  // on_grad(index) runs after each accumulation. Returns how many parameters take a gradient
  // (0 when nothing is communicated: world size 1 without dtype changes).
  size_t arm_grad_hooks(const std::function<void(size_t)>& on_grad);
  // With `reduce`: copies the full gradients (plus those kept from backwards without sync)
  // into a buffer, frees them, reshards, issues the reduce-scatter. Without: keeps the full
  // gradients unsharded for a later reducing backward (FSDP2's set_requires_gradient_sync(False))
  // and reshards. A no-op when the parameters were never gathered for backward or no parameter
  // got a gradient. Returns whether a reduce-scatter is now in flight. The caller runs it at
  // most once per backward.
  bool post_backward(bool reduce);
  // Waits for the reduce-scatter in flight (if any) and, with hybrid sharding, for the
  // all-reduce across replicas after it (issuing it if needed), adds each rank's rows into the
  // sharded grads and frees the buffers.
  void finish_reduce();
  // Hybrid sharding: waits for the reduce-scatter in flight and issues the all-reduce of its
  // result across replicas, without waiting for it (finish_reduce does).
  void start_all_reduce();
  bool reduce_scatter_in_flight() const { return reduce_work_ && !all_reduce_issued_; }
  bool hybrid() const { return replicate_ != nullptr; }
  // Drops the hooked accumulators of this backward (after finish_reduce).
  void end_backward();

  const std::vector<FsdpParam>& params() const { return params_; }
  std::vector<FsdpParam>& params() { return params_; }
  const ProcessGroupPtr& pg() const { return pg_; }
  const ProcessGroupPtr& replicate() const { return replicate_; }

  // Profiler range names carrying the unit's name in the root (set by the root's lazy init).
  void set_unit_name(const std::string& name) { range_names_ = UnitRangeNames(name); }
  const UnitRangeNames& range_names() const { return range_names_; }

 private:
  enum class State { kSharded, kGathering, kFull };
  // After a gather completed: returns its buffers to the pool.
  void release_gather_buffers();

  ProcessGroupPtr pg_;
  ProcessGroupPtr replicate_;
  Accounting* acct_ = nullptr;
  at::ScalarType compute_dtype_;
  at::ScalarType reduce_dtype_;
  std::vector<FsdpParam> params_;
  FlatLayout gather_layout_, reduce_layout_;  // collectives.h
  bool passthrough_ = false;                  // world size 1 without dtype changes: nothing to move
  UnitRangeNames range_names_;

  State state_ = State::kSharded;
  WorkPtr gather_work_;
  at::Tensor gather_in_, gather_out_;

  WorkPtr reduce_work_;  // the reduce-scatter, then (hybrid) the all-reduce after it
  bool all_reduce_issued_ = false;
  at::Tensor reduce_in_, reduce_out_;
  std::vector<bool> reduced_had_grad_;
};

}  // namespace fsdp::detail
