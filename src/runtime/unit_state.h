// Internal: what fully_shard attaches to a module (FSDP2's FSDPState): one unit's options and
// name, its children, the explicit prefetch lists, and the wiring that tells its ParamGroup
// when things happen: a forward entered (pre_forward) and left (post_forward), the gradient
// reaching its outputs (pre_backward, through a hook on each output) and its inputs (the
// post-backward function on each input). The lifecycle itself (what gathers, frees and
// reduces, and the state it is in) is the ParamGroup's; the tree-wide order is the Tree's.
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/stats.h"
#include "runtime/param_group.h"
#include "runtime/tree.h"

namespace fsdp::detail {

// Explicit prefetch (set_modules_to_*_prefetch); not set: the recorded order.
struct PrefetchSettings {
  std::vector<std::weak_ptr<UnitState>> forward, backward;
  bool explicit_forward = false, explicit_backward = false;
};

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  // `modules`: one, or the members of one unit made of several (fully_shard of a list: one
  // gather before the first member's forward, freed after the last's). `post_forward` (may be
  // null): the smaller group of reshard_after_forward_ranks.
  UnitState(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, const DeviceMesh& mesh,
            FullyShardOptions options, std::vector<std::pair<std::string, at::Tensor>> params,
            ProcessGroupPtr post_forward, const std::vector<int>& shard_dims = {});

  // The (first) module; null once it is destroyed.
  std::shared_ptr<torch::nn::Module> module() const { return modules_.front().lock(); }
  // The modules still alive.
  std::vector<std::shared_ptr<torch::nn::Module>> modules() const;
  // Whether `m` is one of the unit's modules.
  bool has_module(const torch::nn::Module* m) const;
  bool is_root() const { return !has_parent_; }
  ParamGroup& group() { return *group_; }
  const std::vector<std::shared_ptr<UnitState>>& children() const { return children_; }
  void adopt(const std::shared_ptr<UnitState>& child);
  // The unit's tree: its own until the root's lazy init joins it to the root's (join).
  Tree& tree() { return *tree_; }
  // The root's lazy init: the unit, and its group's communication, join the root's tree.
  void join(std::shared_ptr<Tree> tree);
  PrefetchSettings& prefetch_settings() { return prefetch_; }
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
  // `hooked_outputs`: whether the backward can find this unit through its outputs. `member`:
  // the module that ran (a unit of several modules completes its forward once every member
  // ran, or at the end of the root's forward); null: the first.
  void post_forward(bool hooked_outputs, const torch::nn::Module* member = nullptr);
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
  // End of backward (Tree): a unit of several modules closes; the group finalises (its
  // per-backward counts, the inputs' among them, start again).
  void end_backward();
  // A failed step (Tree::reset): the group resets (its counts go); the order position goes.
  void reset_step();

  // --- FSDPModule ---
  MemoryStats memory_stats() const;

 private:
  void prefetch(const std::vector<std::weak_ptr<UnitState>>& units);
  // Root, end of forward: a checkpointed unit whose module ran outside its fsdp::Unit (its
  // parameters are in this forward's graph, but the unit did not run) is an error.
  static void check_checkpointed_units_ran(const Tree& tree);

  std::vector<std::weak_ptr<torch::nn::Module>> modules_;
  // A unit of several modules: open from the first member's pre-forward until every member ran
  // (each once or more) or the root's forward ends; which members ran, and whether every one's
  // outputs were hooked.
  bool group_open_ = false;
  std::vector<bool> members_ran_;
  bool members_hooked_ = true;
  void close_group();
  // The unit's post-forward proper (after its last member, or alone).
  void complete_forward(bool hooked_outputs);
  FullyShardOptions options_;
  std::shared_ptr<Tree> tree_;  // before group_: the group is made with the tree's CommContext
  std::shared_ptr<ParamGroup> group_;
  std::string name_;  // qualified name in the root's tree, set by the root's lazy init
  bool has_parent_ = false;
  std::vector<std::shared_ptr<UnitState>> children_;
  PrefetchSettings prefetch_;
  int post_forward_index_ = -1;
};

}  // namespace fsdp::detail
