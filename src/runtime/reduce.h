// Internal: a unit's gradient reduction (FSDP2's foreach_reduce, _fsdp_collectives.py): the full
// gradients copied into one flat buffer, reduce-scattered over the shard group, with hybrid
// sharding all-reduced across replicas, then added into the parameters' sharded gradients. One
// function; its variants are the arguments (ReduceSpec); it returns what to wait on
// (Reduction), which joins the tree's reductions in flight (held by its CommContext) and is
// finished by the schedule below (track_reduction, finish_reductions).
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/layout.h"
#include "runtime/collectives.h"
#include "runtime/comm_context.h"
#include "runtime/fsdp_param.h"
#include "util/profiler_range.h"

namespace fsdp::detail {

// How one reduction runs: FSDPModule's switches as they stand when the unit's backward ends.
struct ReduceSpec {
  ProcessGroupPtr shard;      // the reduce-scatter's group
  ProcessGroupPtr replicate;  // hybrid sharding: the reduced shard is all-reduced over it; or null
  at::ScalarType dtype = at::kFloat;  // the reduce dtype
  // 0: averaged at each level (the engines' own average, as FSDP2); otherwise summed and
  // divided by this factor once at the end (set_gradient_divide_factor).
  double divide_factor = 0;
  // Hybrid sharding: false keeps the reduced shard in `deferred` for the next reduction with it
  // on (set_requires_all_reduce(false)).
  bool all_reduce = true;
  // Every parameter of the layout receives the reduced rows, whether it got a gradient on this
  // rank or not (set_reduce_scatter_unused_params: other ranks may have had one).
  bool zeros_if_unused = false;
  // The parameters' shards are in host memory (CPUOffloadPolicy): the reduced shard is copied
  // there before it is added into their gradients.
  bool to_host = false;
  // With to_host: the host tensor is pinned where the reduced shard is on a GPU.
  bool pin_host = false;
  // The custom reduce-scatter and the all-reduce hook (fsdp/runtime/comm_hooks.h).
  CommHooks hooks;
};

// Reduced shards kept across backwards for a later all-reduce across replicas, and which
// parameters they hold gradients of. Shared between a ParamGroup and its reductions.
struct DeferredReduce {
  at::Tensor reduced;  // [layout.total] in the reduce dtype; undefined when nothing waits
  std::vector<bool> had_grad;
};

class Reduction {
 public:
  // The reduce-scatter is issued; foreach_reduce builds it.
  Reduction(std::vector<FsdpParam*> params, const FlatLayout& layout, const ReduceSpec& spec,
            std::vector<bool> had_grad, at::Tensor input, at::Tensor output, WorkPtr work,
            std::shared_ptr<DeferredReduce> deferred, std::shared_ptr<CommContext> comm,
            std::shared_ptr<const UnitRangeNames> names);

  bool hybrid() const { return spec_.replicate != nullptr; }
  // The reduce-scatter has not been waited for yet.
  bool reduce_scatter_pending() const { return stage_ == Stage::kReduceScatter; }
  bool finished() const { return stage_ == Stage::kFinished; }
  // Hybrid sharding: waits for the reduce-scatter, returns its (world-sized) input to the pool
  // and issues the all-reduce of the reduced shard across replicas, without waiting for it.
  // A no-op otherwise, or when already done.
  void start_all_reduce();
  // Waits for what is in flight (issuing the all-reduce first when hybrid), divides by the
  // factor, adds each parameter's rows into its sharded gradient (or, with all_reduce off,
  // into `deferred`), and returns the buffers. Idempotent.
  void finish();

 private:
  enum class Stage { kReduceScatter, kAllReduce, kFinished };
  // Waits for `work_`, timed as exposed communication while the context lives.
  void wait_work();
  // A buffer back to the context's pool, uncounted (dropped when the context is gone).
  void release(at::Tensor& buffer);

  std::vector<FsdpParam*> params_;
  FlatLayout layout_;
  ReduceSpec spec_;
  std::vector<bool> had_grad_;
  at::Tensor input_, output_;
  WorkPtr work_;  // the reduce-scatter, then (hybrid) the all-reduce
  Stage stage_ = Stage::kReduceScatter;
  std::shared_ptr<DeferredReduce> deferred_;
  // Weak: the context holds the reductions in flight (a strong pointer back would keep both,
  // the pool and the process groups, alive past the model that owns them).
  std::weak_ptr<CommContext> comm_;
  std::shared_ptr<const UnitRangeNames> names_;
};

// Takes every full gradient of `params` (kept ones included; those a parameter no longer in
// `layout` has are dropped), copies them into one [world, layout.total] buffer in the reduce
// dtype (zeros for padding and for parameters without one), and issues the reduce-scatter.
// Returns null when no parameter had a gradient and !spec.zeros_if_unused (the same on every
// rank: the graphs are). The parameters must outlive the reduction.
std::shared_ptr<Reduction> foreach_reduce(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                          const ReduceSpec& spec,
                                          std::shared_ptr<DeferredReduce> deferred,
                                          std::shared_ptr<CommContext> comm,
                                          std::shared_ptr<const UnitRangeNames> names);

// --- the reductions in flight (CommContext::reductions_in_flight) ---
// A reduction just issued joins `comm`'s queue: older ones finish so that at most
// kReductionsInFlight stay alive; with hybrid sharding the one before the newest moves on to
// its all-reduce across replicas instead of finishing.
void track_reduction(CommContext& comm, std::shared_ptr<Reduction> reduction);
// Finishes every reduction in `comm`'s queue, oldest first, and empties it (the end of a
// backward, a failed step).
void finish_reductions(CommContext& comm);

}  // namespace fsdp::detail
