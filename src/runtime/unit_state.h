// Internal: what fully_shard attaches to a module: one unit, its options, its ParamGroup, its
// children and its per-backward state, and what happens around its own forward and backward
// (pre/post-forward, pre/post-backward). Tree-wide behaviour is the Tree's. FSDP2's FSDPState.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/stats.h"
#include "runtime/param_group.h"
#include "runtime/tree.h"

namespace fsdp::detail {

// What FSDPModule's setters change (FSDP2's per-state and per-group flags).
struct UnitSettings {
  std::optional<bool> reshard_after_forward;  // unset: true except for the root
  bool requires_gradient_sync = true;
  bool requires_all_reduce = true;
  bool reshard_after_backward = true;
  bool reduce_scatter_unused_params = false;
  double gradient_divide_factor = 0;  // 0: the number of ranks
  // Explicit prefetch (set_modules_to_*_prefetch); empty: the recorded order.
  std::vector<std::weak_ptr<UnitState>> forward_prefetch, backward_prefetch;
  bool explicit_forward_prefetch = false, explicit_backward_prefetch = false;
};

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  // `post_forward` (may be null): the smaller group of reshard_after_forward_ranks.
  UnitState(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
            FullyShardOptions options, std::vector<std::pair<std::string, at::Tensor>> params,
            ProcessGroupPtr post_forward);

  std::shared_ptr<torch::nn::Module> module() const { return module_.lock(); }
  bool is_root() const { return !has_parent_; }
  ParamGroup& group() { return group_; }
  const ParamGroup& group() const { return group_; }
  const std::vector<std::shared_ptr<UnitState>>& children() const { return children_; }
  void adopt(const std::shared_ptr<UnitState>& child);
  Tree& tree() { return *tree_; }
  const Tree& tree() const { return *tree_; }
  void join(std::shared_ptr<Tree> tree) { tree_ = std::move(tree); }
  UnitSettings& settings() { return settings_; }
  const FullyShardOptions& options() const { return options_; }
  void set_name(const std::string& name);
  // "unit 'layers.3' (TransformerBlockImpl)": the module's name in the root, known after the
  // root's first forward, and its class.
  std::string describe() const;

  // --- forward (forward.cpp runs these around the module's forward) ---
  void pre_forward();
  // Casts to param_dtype and attaches the post-backward function.
  at::Tensor prepare_input(const at::Tensor& input);
  // Casts to output_dtype and hooks the pre-backward. Returns false when `output` does not
  // require a gradient.
  bool prepare_output(at::Tensor& output);
  // `hooked_outputs`: whether the backward can find this unit through its outputs.
  void post_forward(bool hooked_outputs);
  // The module's forward threw: frees what pre-forward gathered, as post-forward would.
  void forward_failed();
  bool checkpoints_forward() const;
  // Around the recompute of this unit's checkpointed forward: gathers the parameters and arms
  // the gradient hooks on them; units called meanwhile skip forward bookkeeping.
  void begin_recompute();
  void end_recompute();

  // --- backward (autograd hooks) ---
  void pre_backward();
  void on_input_grad();
  void on_param_grad(size_t index, const at::Tensor& grad);
  // Runs this unit's post-backward once per backward; a reduce-scatter it issues joins the
  // tree's reductions in flight.
  void run_post_backward();
  // End of backward (Tree): reshard (as set) and reset the per-backward state.
  void end_backward(bool reshard);
  // A failed step (Tree::reset): drop the per-backward state and reshard.
  void reset_step();

  // --- FSDPModule ---
  void unshard_async();
  void wait_unshard();
  void reshard();
  MemoryStats memory_stats() const;

 private:
  // The state of one backward, reset in one place (end_backward / reset_step). Several
  // forwards may feed one backward, so nothing here is reset by a forward.
  struct BackwardState {
    bool pre_backward_done = false;
    // Inputs wrapped by the post-backward function, and how many of them got their gradient.
    int inputs_wrapped = 0, inputs_grad_seen = 0;
    // Parameters whose gradient autograd has delivered.
    std::vector<bool> grad_ready;
    size_t grads_seen = 0;
    bool post_backward_done = false;  // at most once per backward
  };

  bool reshard_after_forward() const;
  // Hooks autograd's accumulators of the gathered parameters to on_param_grad.
  void arm_grad_hooks();
  void prefetch(const std::vector<std::weak_ptr<UnitState>>& units);
  // Root, end of forward: a checkpointed unit whose module ran outside its fsdp::Unit (its
  // parameters are in this forward's graph, but the unit did not run) is an error.
  void check_checkpointed_units_ran() const;

  std::weak_ptr<torch::nn::Module> module_;
  FullyShardOptions options_;
  ParamGroup group_;
  std::shared_ptr<Tree> tree_;
  std::string name_;  // qualified name in the root's tree, set by the root's lazy init
  bool has_parent_ = false;
  std::vector<std::shared_ptr<UnitState>> children_;
  UnitSettings settings_;
  int post_forward_index_ = -1;
  // Parameters that take a gradient, counted when the forward arms the gradient hooks.
  size_t grads_expected_ = 0;
  BackwardState backward_;
};

}  // namespace fsdp::detail
