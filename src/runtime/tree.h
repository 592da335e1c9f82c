// Internal: one tree of units, a root and every unit inside it, and what the units do
// together: lazy init, the forward orders prefetching follows, the end-of-backward callback,
// and the reset after a failed step. FSDP2's FSDPStateContext with the root state's tree-wide
// methods; what the units share for communication is the tree's CommContext.
//
// Until the root's lazy init each unit has a tree of its own (a unit used alone, or one whose
// root has not run yet); lazy init moves every unit of the root onto the root's tree. Each
// unit (UnitState) holds its tree; its ParamGroup knows only the tree's CommContext.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <memory>
#include <vector>

#include "runtime/comm_context.h"

namespace fsdp::detail {

class UnitState;

class Tree : public std::enable_shared_from_this<Tree> {
 public:
  // Where the tree is in a step. kForward: a forward ran with grad mode on and no backward has
  // begun; kBackward: the end-of-backward callback is queued.
  enum class Phase { kIdle, kForward, kBackward };

  // The root's lazy init: every unit of `root`'s subtree joins this tree (checked: one world
  // size) and learns its name in the root. Throws InvalidArgument naming the units otherwise.
  void init(UnitState& root);
  bool initialised() const { return initialised_; }
  // Every unit, root first, parents before children (deterministic: the same on every rank).
  const std::vector<UnitState*>& units() const { return units_; }
  const std::shared_ptr<CommContext>& comm_ptr() const { return comm_; }

  // --- forward ---
  // The root's pre-forward (not a recompute): resets a tree left dirty by a failed or dropped
  // step, then starts this step's forward order.
  void begin_forward();
  // A unit's pre-forward: appends it to this step's order.
  void record_pre_forward(UnitState* unit);
  // The unit that ran after the current one in the last complete forward (forward prefetch),
  // or null.
  UnitState* forward_successor(const UnitState* unit) const;
  bool ran_this_forward(const UnitState* unit) const;
  // A unit's post-forward: its index in this step's post-forward order.
  int record_post_forward(UnitState* unit);
  // The unit whose post-forward came before `index` (backward prefetch visits the reverse
  // order), or null.
  UnitState* post_forward_predecessor(int index) const;
  // The root's post-forward: the forward completed (its order is the next step's to follow).
  void end_forward(bool grad_mode);
  // An output hooked for the backward: while any lives, a backward may still come.
  void note_output(const at::Tensor& output);
  int recompute_depth() const { return recompute_depth_; }
  void enter_recompute() { ++recompute_depth_; }
  void leave_recompute() { --recompute_depth_; }

  // --- backward ---
  // Any backward hook of the tree: queues the end-of-backward callback on the autograd engine
  // once per backward.
  void on_backward_hook();
  // A backward of this tree is running: its callback is queued and its graph task alive.
  bool backward_running() const;
  // The end-of-backward callback: units whose gradients were incomplete reduce what they have,
  // every reduction is finished (unless set_is_last_backward(false)), every unit reshards
  // (unless set_reshard_after_backward(false)) and its per-backward state is reset.
  void end_backward();
  bool is_last_backward = true;

  // --- failures ---
  // Resets a tree whose last step cannot complete: a backward that threw (its graph task died
  // before the callback ran), or a forward whose outputs are all gone without a backward (it
  // threw, or its loss was dropped). Cheap when the tree is clean. Called at the root's
  // pre-forward and at every public entry point that reads or changes the tree's state.
  void recover_if_stale();
  // Unconditionally: finishes reductions in flight, drops gradients not yet reduced, reshards
  // every unit, clears the per-step state.
  void reset();

 private:
  bool stale() const;

  bool initialised_ = false;
  std::vector<UnitState*> units_;  // raw: the root's children own the other units
  Phase phase_ = Phase::kIdle;
  // Units in the order their forward started, this step and the last complete one.
  std::vector<UnitState*> forward_order_, last_forward_order_;
  // Units in the order their forward ended: backward visits them in reverse.
  std::vector<UnitState*> post_forward_order_;
  // Outputs of this step's forwards (their grad_fn), held weakly.
  std::vector<std::weak_ptr<torch::autograd::Node>> outputs_;
  // Alive exactly as long as the queued end-of-backward callback (which holds the other
  // reference): the graph task that owns the callback died when this expires.
  std::weak_ptr<int> callback_token_;
  int recompute_depth_ = 0;
  std::shared_ptr<CommContext> comm_ = std::make_shared<CommContext>();
};

}  // namespace fsdp::detail
