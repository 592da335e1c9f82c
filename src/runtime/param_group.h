// Internal: the parameters of one fully_shard call and their whole lifecycle (FSDP2's
// FSDPParamGroup): pre-forward (gather, arm the gradient hooks), post-forward (free, or keep
// this rank's rows of a smaller group), pre-backward (gather again), the gradient hooks, and
// post-backward (reduce the gradients, free), with the unit's state as two enums
// (fsdp/runtime/lifecycle.h). The autograd accumulator hooks call the group directly.
//
// What it decides with: its settings (FSDPModule's switches), when its backward is over
// (backward_end.h, fed by the three triggers below) and its tree's CommContext (buffers,
// counters, reductions in flight). What it moves: one all-gather per gather (copy-in,
// all-gather, copy-out: all_gather.h) and one reduction per backward (reduce.h). When a unit's
// forward and backward run is UnitState's wiring (hooks on inputs and outputs) and the Tree's
// order; the group knows no Tree (the unit reaches it) and calls nothing above it but the
// listener the unit gives it (set_on_grad_hook).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/comm/device_mesh.h"
#include "fsdp/runtime/lifecycle.h"
#include "fsdp/runtime/mixed_precision.h"
#include "runtime/backward_end.h"
#include "runtime/collectives.h"
#include "runtime/comm_context.h"
#include "runtime/fsdp_param.h"
#include "runtime/reduce.h"
#include "util/profiler_range.h"

namespace fsdp::detail {

// FSDPModule's switches that act on a group (FSDP2 keeps them on FSDPParamGroup).
struct GroupSettings {
  std::optional<bool> reshard_after_forward;  // unset: true except for the root
  bool reshard_after_backward = true;
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;
  bool reduce_scatter_unused_params = false;
  double gradient_divide_factor = 0;  // 0: the number of ranks
  CommHooks hooks;  // set_custom_all_gather, set_custom_reduce_scatter, set_all_reduce_hook
};

// What post_forward does with the full parameters.
enum class AfterForward {
  kAsSet,  // free them as reshard_after_forward says (to the smaller group's rows with
           // reshard_after_forward_ranks)
  kFree,   // free them (no backward will follow: grad mode off)
  kKeep,   // keep them (the backward cannot find the unit through its outputs)
};

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  // `mesh.shard` shards the parameters; `mesh.replicate` (null without hybrid sharding) is the
  // group their reduced gradient shards are all-reduced over. `post_forward` (null unless
  // reshard_after_forward_ranks is set) is the smaller group this rank's parameters stay
  // sharded over between forward and backward. `owner` names the unit, for messages. `comm`:
  // the CommContext of the unit's tree (its own until the root's lazy init: use_comm).
  // `offload`: the shards in host memory (CPUOffloadPolicy), copied to the device for each
  // gather and their reduced gradients copied back.
  ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, const DeviceMesh& mesh,
             MixedPrecisionPolicy mp, ProcessGroupPtr post_forward, const std::string& owner,
             std::shared_ptr<CommContext> comm,
             std::optional<CPUOffloadPolicy> offload = std::nullopt,
             const std::vector<int>& shard_dims = {});

  // The root's lazy init: the group uses the CommContext of the root's tree.
  void use_comm(std::shared_ptr<CommContext> comm) { comm_ = std::move(comm); }
  CommContext& comm() { return *comm_; }
  // Runs on each gradient the accumulator hooks take, before the group counts it (the unit
  // queues its tree's end-of-backward callback there).
  void set_on_grad_hook(std::function<void()> listener) { on_grad_hook_ = std::move(listener); }
  // A unit inside another: reshard_after_forward defaults to true (the root's to false).
  void set_nested() { nested_ = true; }
  // Activation checkpointing: each forward's gradients reach the accumulators in a backward of
  // their own (the recompute's), instead of autograd summing every use first.
  void set_gradients_per_use(bool on) { backward_end_.set_gradients_per_use(on); }

  GroupSettings& settings() { return settings_; }
  TrainingState training_state() const { return training_; }
  ShardedState sharded_state() const { return sharded_; }

  // --- the lifecycle (FSDP2's FSDPParamGroup methods of the same names) ---
  // Waits for the gather (issuing it if no prefetch did) and, with grad mode on, hooks
  // autograd's accumulators of the parameters that require a gradient.
  void pre_forward();
  void post_forward(AfterForward what);
  // Once per backward (returns false when this backward already ran it): gathers again.
  bool pre_backward();
  // A forward run again inside the backward (activation checkpointing's recompute): gathers
  // and, with `arm_hooks`, arms the gradient hooks, leaving the training state as it is (the
  // unit's place in this backward: a recompute must not let it run its post-backward twice).
  void pre_recompute(bool arm_hooks);
  // --- the end of this unit's backward: three triggers, one decision (backward_end.h) ---
  // (1) take_param_grad below. (2) The gradient reached one of the inputs routed through the
  // post-backward function (each counted by input_wrapped). (3) The end of the tree's
  // backward, first for every unit (tree order), before the reductions in flight finish.
  // Whichever trigger ends the backward first runs post_backward, once per backward.
  void input_wrapped() { backward_end_.input_wrapped(); }
  void input_grad_arrived();
  void tree_backward_ended();
  // After every unit's tree_backward_ended: frees as set, drops the hooked accumulators and
  // the per-backward counts; back to kIdle.
  void finalize_backward();
  // A failed step: drops full gradients not yet reduced, reshards, back to kIdle.
  void reset();

  // --- gathering (FSDPModule::unshard/reshard, prefetch) ---
  // Issues the all-gather unless the parameters are full or a gather is in flight.
  void unshard();
  // Completes an issued gather (issuing one if needed): the parameters hold full tensors.
  void wait_for_unshard();
  // Points the parameters back at their shards and frees the full tensors (waits out a gather
  // still in flight first).
  void reshard();

  // (1) The accumulator pre-hook of parameter `index`: takes autograd's full gradient (returns
  // false when gradients go to grad() as they are: one rank, no dtype change, no divide
  // factor); when every trainable parameter's gradient arrived and none is frozen, the unit's
  // backward is over and post_backward runs.
  bool take_param_grad(size_t index, const at::Tensor& grad);
  // Whether an accumulator of these parameters alive now was hooked by someone else's graph:
  // the unit's module ran outside its fsdp::Unit.
  bool params_in_foreign_graph() const;

  const std::vector<FsdpParam>& params() const { return params_; }
  const ProcessGroupPtr& pg() const { return pg_; }

  // Profiler range names carrying the unit's name in the root (set by the root's lazy init).
  void set_unit_name(const std::string& name);
  const UnitRangeNames& range_names() const { return *range_names_; }

 private:
  // An all-gather in flight: its work and buffers, and whether it runs within post_forward_.
  struct Gather {
    WorkPtr work;
    at::Tensor input, output;
    bool small = false;
  };

  bool reshard_after_forward() const;
  // Once per backward, when backward_end_ says it is over: with gradient sync, reduces the
  // full gradients (one reduction, joining the CommContext's reductions in flight) and frees
  // the parameters (unless reshard_after_backward is off); without, keeps them unsharded
  // (set_requires_gradient_sync(false)). A no-op when the parameters were never gathered for
  // backward and nothing is kept.
  void post_backward();
  // One rank holding everything in its own dtype: no copy and no collective is needed (the
  // shard is the full parameter); gradients too unless a divide factor is set.
  bool grads_pass_through() const {
    return params_pass_through() && settings_.gradient_divide_factor == 0 &&
           !settings_.hooks.reduce_scatter && !settings_.hooks.all_reduce;
  }
  // Parameters need no gather (one rank, no cast, no offload) unless a custom all-gather is set:
  // it runs at any size (a quantized gather rounds the weights at world 1 too).
  bool params_pass_through() const { return params_pass_through_ && !settings_.hooks.all_gather; }
  void arm_grad_hooks();
  // Rebuilds the reduce layout when the trainable parameters changed (not while this group's
  // reduction is in flight).
  void refresh_reduce_layout();
  void reshard_to_post_forward();
  void release_gather_buffers();
  void attach_full_tensors();
  void release_full_tensors();
  std::vector<ParamShape> shapes() const;
  at::TensorOptions buffer_options(at::ScalarType dtype) const;

  ProcessGroupPtr pg_;
  ProcessGroupPtr replicate_;
  at::ScalarType compute_dtype_;
  at::ScalarType reduce_dtype_;
  std::vector<FsdpParam> params_;
  FlatLayout gather_layout_, reduce_layout_;
  std::vector<bool> trainable_;  // what the reduce layout was built for
  bool params_pass_through_ = false;
  bool offload_ = false;
  bool pin_host_ = false;  // offload into pinned memory (CPUOffloadPolicy::pin_memory)
  bool nested_ = false;
  std::shared_ptr<const UnitRangeNames> range_names_;
  GroupSettings settings_;

  std::shared_ptr<CommContext> comm_;
  std::function<void()> on_grad_hook_;

  TrainingState training_ = TrainingState::kIdle;
  ShardedState sharded_ = ShardedState::kSharded;
  Gather gather_;

  // reshard_after_forward_ranks: the smaller group, its layout, and this rank's rows of it
  // kept between forward and backward (defined in kShardedPostForward).
  ProcessGroupPtr post_forward_;
  FlatLayout post_forward_layout_;
  at::Tensor post_forward_shard_;

  // When this backward is over (every count of the three triggers).
  BackwardEnd backward_end_;
  // The last reduction issued (finished before the next one starts, and before the reduce
  // layout may change), and reduced shards kept for a later all-reduce across replicas.
  std::shared_ptr<Reduction> reduction_;
  std::shared_ptr<DeferredReduce> deferred_ = std::make_shared<DeferredReduce>();
};

}  // namespace fsdp::detail
