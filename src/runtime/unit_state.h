// Internal: what fully_shard attaches to a module. Decides *when* to gather, free and reduce
// (the backend decides how): pre/post-forward, pre/post-backward, prefetch, and the root's
// end-of-backward callback. FSDP2's FSDPState.
#pragma once

#include <torch/nn/module.h>

#include <deque>
#include <memory>
#include <vector>

#include "fsdp/comm_stats.h"
#include "fsdp/fully_shard_options.h"
#include "fsdp/memory_stats.h"
#include "runtime/param_group.h"
#include "runtime/tree_context.h"

namespace fsdp::detail {

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  // `replicate` (may be null): the replica group of hybrid sharding (ParamGroup).
  UnitState(const std::shared_ptr<torch::nn::Module>& module, ProcessGroupPtr pg,
            ProcessGroupPtr replicate, FullyShardOptions options,
            std::vector<std::pair<std::string, at::Tensor>> params);

  bool module_is(const torch::nn::Module* m) const;
  std::shared_ptr<torch::nn::Module> module() const { return module_.lock(); }
  bool has_parent() const { return has_parent_; }
  const ParamGroup& group() const { return *group_; }
  void adopt(const std::shared_ptr<UnitState>& child);

  void pre_forward();
  // Casts to param_dtype and attaches the post-backward function.
  at::Tensor cast_forward_input(const at::Tensor& input);
  void on_input_grad();
  // Casts to output_dtype and hooks the pre-backward.
  void post_forward_output(at::Tensor& output);
  void post_forward();
  void pre_backward();
  void on_param_grad(size_t index);
  void unshard();
  void reshard();
  // Off: post-backward keeps full gradients instead of reducing them (ParamGroup).
  void set_requires_gradient_sync(bool sync, bool recurse);
  bool checkpoints_forward() const;
  // Around the recompute of this unit's checkpointed forward: gathers the parameters and arms
  // the gradient hooks on them; units called meanwhile skip forward bookkeeping.
  void begin_recompute();
  void end_recompute();
  // "unit 'layers.3' (TransformerBlockImpl)": the module's name in the root, known after the
  // root's first forward, and its class.
  std::string describe() const;
  MemoryStats memory_stats() const;
  CommStats comm_stats() const { return CommStats{ctx_->acct.exposed_comm_seconds}; }

 private:
  // The state of one backward, reset in one place (the end-of-backward callback). Several
  // forwards may feed one backward, so nothing here is reset by a forward.
  struct BackwardState {
    bool pre_backward_done = false;
    // Inputs wrapped by the post-backward function, and how many of them got their gradient.
    int inputs_wrapped = 0, inputs_grad_seen = 0;
    // Parameters whose gradient autograd has accumulated.
    std::vector<bool> grad_ready;
    size_t grads_seen = 0;
    // Post-backward ran (at most once per backward).
    bool post_backward_done = false;
  };

  bool is_root() const { return !has_parent_; }
  void lazy_init();
  void ensure_final_callback();
  // Runs this unit's post-backward once per backward; a reduce-scatter it issues joins the
  // tree's reductions in flight.
  void run_post_backward();
  // After a new reduce-scatter, finishes older ones so that at most one reduce-scatter (and,
  // with hybrid sharding, one all-reduce) is in flight besides it, bounding memory (FSDP2 keeps
  // one).
  void track_reduction(ParamGroup* group);
  void final_callback();
  bool reshard_after_forward() const;
  // Every unit of this root's tree, this one first, in a deterministic order. Raw pointers:
  // children_ owns the others, and a strong self-reference would keep the tree alive forever.
  std::vector<UnitState*> collect_tree();
  void use_context(std::shared_ptr<TreeContext> ctx);
  // Hooks autograd's accumulators of the gathered parameters to on_param_grad.
  void arm_grad_hooks();
  // Root, end of forward: a checkpointed unit whose module ran outside its fsdp::Unit (its
  // parameters are in this forward's graph, but the unit did not run) is an error.
  void check_checkpointed_units_ran() const;

  std::weak_ptr<torch::nn::Module> module_;
  FullyShardOptions options_;
  std::shared_ptr<ParamGroup> group_;
  // The tree's shared state: this unit's own until the root's lazy init hands it the root's.
  std::shared_ptr<TreeContext> ctx_;
  std::string name_;  // qualified name in the root's tree, set by the root's lazy init
  bool requires_gradient_sync_ = true;
  bool has_parent_ = false;
  bool initialised_ = false;  // root: lazy init done
  std::vector<std::shared_ptr<UnitState>> children_;
  int post_forward_index_ = -1;
  // Parameters that take a gradient, counted when the forward arms the gradient hooks.
  size_t grads_expected_ = 0;
  BackwardState backward_;
};

}  // namespace fsdp::detail
