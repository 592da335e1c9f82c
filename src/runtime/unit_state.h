// Internal: what fully_shard attaches to a module. Decides *when* to gather, free and reduce
// (the backend decides how): pre/post-forward, pre/post-backward, prefetch, and the root's
// end-of-backward callback. FSDP2's FSDPState.
#pragma once

#include <torch/nn/module.h>

#include <deque>
#include <memory>
#include <vector>

#include "fsdp/fully_shard.h"
#include "runtime/accounting.h"
#include "runtime/param_group.h"

namespace fsdp::detail {

class UnitState : public std::enable_shared_from_this<UnitState> {
 public:
  UnitState(const std::shared_ptr<torch::nn::Module>& module, ProcessGroupPtr pg,
            FullyShardOptions options, std::vector<std::pair<std::string, at::Tensor>> params);

  bool module_is(const torch::nn::Module* m) const;
  ParamGroup& group() { return *group_; }
  const ParamGroup& group() const { return *group_; }
  bool has_parent() const { return has_parent_; }
  void adopt(const std::shared_ptr<UnitState>& child);

  void pre_forward();
  // Casts to param_dtype and attaches the post-backward function.
  at::Tensor cast_input(const at::Tensor& input);
  void on_input_grad();
  void hook_output(at::Tensor& output);
  void post_forward();
  void pre_backward();
  void on_param_grad(size_t index);
  void unshard();
  void reshard();
  MemoryStats memory_stats() const;

 private:
  UnitState& root() const;
  void lazy_init();
  void ensure_final_callback();
  // Runs this unit's post-backward; a reduce-scatter it issues joins the root's in-flight list.
  void run_post_backward();
  // Root: after a new reduce-scatter, finishes older ones so that at most
  // kMaxReductionsInFlight gradient buffers are alive (FSDP2 keeps one), bounding memory.
  void track_reduction(ParamGroup* group);
  void final_callback();
  bool reshard_after_forward() const;
  // Every unit of this root's tree, this one first, in a deterministic order. Raw pointers:
  // children_ owns the others, and a strong self-reference would keep the tree alive forever.
  std::vector<UnitState*> collect_tree();

  std::weak_ptr<torch::nn::Module> module_;
  FullyShardOptions options_;
  std::shared_ptr<ParamGroup> group_;
  std::shared_ptr<Accounting> acct_ = std::make_shared<Accounting>();
  bool has_parent_ = false;
  std::weak_ptr<UnitState> root_;
  std::vector<std::shared_ptr<UnitState>> children_;
  bool pre_backward_done_ = false;
  int post_forward_index_ = -1;
  int inputs_wrapped_ = 0, inputs_grad_seen_ = 0;

  // Root only.
  bool initialised_ = false;
  std::vector<UnitState*> tree_;
  std::vector<UnitState*> forward_order_, last_forward_order_;
  std::vector<UnitState*> post_forward_order_;
  bool callback_queued_ = false;
  std::deque<ParamGroup*> reductions_in_flight_;
};

}  // namespace fsdp::detail
