// Internal: the parameters of one fully_shard call and their collectives: one all-gather to
// unshard them all (copy-in, all-gather, copy-out) and one reduce-scatter for their gradients
// (copy-in, reduce-scatter, accumulate into the sharded grads). FSDP2's FSDPParamGroup.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/mixed_precision.h"
#include "fsdp/process_group.h"
#include "runtime/accounting.h"
#include "runtime/fsdp_param.h"

namespace fsdp::detail {

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, ProcessGroupPtr pg,
             MixedPrecisionPolicy mp);

  // Issues the all-gather unless the parameters are full or a gather is in flight.
  void unshard_async(Accounting& acct);
  // Completes an issued gather (issuing one if needed) and points parameters at full tensors.
  void wait_unshard(Accounting& acct);
  // Points parameters back at their shards and frees the full tensors (waits out a gather
  // still in flight first).
  void reshard(Accounting& acct);
  bool is_full() const { return state_ == State::kFull; }

  // Hooks autograd's gradient accumulators of the current full parameters, so that the group
  // learns when all its gradients exist: on_grad(index) runs after each accumulation.
  void arm_grad_hooks(const std::function<void(size_t)>& on_grad);
  // Called by the hooks. True when every parameter has its gradient and none is frozen: the
  // unit's backward is over before the gradient reaches its inputs (post_backward may run).
  bool on_grad_ready(size_t index);
  // Copies the full gradients into a buffer, frees them, reshards, issues the reduce-scatter.
  // At most once per backward; a no-op when no parameter got a gradient. Returns whether a
  // reduce-scatter is now in flight.
  bool post_backward(Accounting& acct);
  // Waits for the reduce-scatter in flight (if any), adds each rank's rows into the sharded
  // grads and frees the buffers.
  void finish_reduce(Accounting& acct);
  // Forgets this backward's bookkeeping (call after finish_reduce).
  void end_backward();

  const std::vector<FsdpParam>& params() const { return params_; }
  std::vector<FsdpParam>& params() { return params_; }
  const ProcessGroupPtr& pg() const { return pg_; }

 private:
  enum class State { kSharded, kGathering, kFull };
  // After a gather completed: returns its buffers to the pool.
  void release_gather_buffers(Accounting& acct);

  ProcessGroupPtr pg_;
  MixedPrecisionPolicy mp_;
  at::ScalarType compute_dtype_;
  at::ScalarType reduce_dtype_;
  std::vector<FsdpParam> params_;
  int64_t padded_total_ = 0;            // per-rank elements of the gather layout
  std::vector<int64_t> gather_offset_;  // per param
  int64_t reduce_total_ = 0;            // per-rank elements of the reduce layout
  std::vector<int64_t> reduce_offset_;  // per param; -1 when it requires no grad
  bool passthrough_ = false;            // world size 1 without dtype changes: nothing to move

  State state_ = State::kSharded;
  WorkPtr gather_work_;
  at::Tensor gather_in_, gather_out_;

  std::vector<bool> grad_ready_;
  size_t grads_expected_ = 0, grads_seen_ = 0;
  bool reduced_this_backward_ = false;
  WorkPtr reduce_work_;
  at::Tensor reduce_in_, reduce_out_;
  std::vector<bool> reduced_has_grad_;

  // Rows per rank of each parameter, for copy-in/out.
  std::vector<std::vector<ShardRange>> ranges_;
};

}  // namespace fsdp::detail
