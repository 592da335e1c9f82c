// Internal: the one decision that a unit's backward is over, so that its post-backward
// (reduce the gradients, free the parameters) runs. Three triggers feed it:
//   (1) the gradient hook of a parameter (the accumulator's pre-hook, FSDP2's post-backward
//       hook): over once every armed parameter's gradient arrived, provided every parameter of
//       the unit takes a gradient (a frozen weight may still be read afterwards to compute the
//       input gradients) and each use's gradients do not arrive in a backward of their own
//       (gradients per use, after several forwards: the first recompute's would end it early
//       and the other uses' gradients would wait a step);
//   (2) the post-backward function on the unit's inputs (FSDP2's
//       RegisterPostBackwardFunction): over once every input wrapped since the last backward
//       got its gradient (several forwards may feed one backward);
//   (3) the end of the tree's backward (the autograd engine's final callback, FSDP2's
//       _root_post_backward_final_callback): over, whatever the counts say (units whose
//       gradients were incomplete, unused or frozen parameters, reduce what they have).
// Every count lives here and nowhere else: they add up across the forwards that feed one
// backward, and only the end of that backward (or a failed step's reset) clears them. Whether
// the post-backward already ran in this backward is the group's training state, not a count:
// a trigger after the first finds it done.
#pragma once

#include <cstddef>
#include <vector>

namespace fsdp::detail {

class BackwardEnd {
 public:
  // The unit has `params` parameters.
  explicit BackwardEnd(size_t params) : params_(params) {}

  // Activation checkpointing: each forward's gradients reach the accumulators in a backward of
  // their own (the recompute's), instead of autograd summing every use first.
  void set_gradients_per_use(bool on) { gradients_per_use_ = on; }
  // A forward of the unit began (not a recompute).
  void forward_began() { ++forwards_; }
  // The gradient hooks were (re)armed: `expected` parameters take a gradient (0: none is
  // hooked, the gradients pass through).
  void hooks_armed(size_t expected) { grads_expected_ = expected; }
  // An input was routed through the post-backward function.
  void input_wrapped() { ++inputs_wrapped_; }

  // --- the triggers: each returns whether the unit's backward is over now ---
  // (1) Parameter `index`'s gradient arrived (again: counted once per backward).
  bool param_grad_arrived(size_t index) {
    if (grad_ready_.size() <= index) grad_ready_.resize(params_, false);
    if (grad_ready_[index]) return false;
    grad_ready_[index] = true;
    const bool one_delivery = !gradients_per_use_ || forwards_ <= 1;
    return ++grads_seen_ == grads_expected_ && grads_expected_ == params_ && one_delivery;
  }
  // (2) A wrapped input's gradient arrived.
  bool input_grad_arrived() { return ++inputs_grad_seen_ == inputs_wrapped_; }
  // (3) The tree's backward ended.
  static bool tree_backward_ended() { return true; }

  // The end of a backward, or a failed step: every count starts again (the armed hooks' count
  // stays: the hooks stay on the accumulators until the next forward arms them again).
  void clear() {
    grad_ready_.clear();
    grads_seen_ = 0;
    forwards_ = 0;
    inputs_wrapped_ = inputs_grad_seen_ = 0;
  }

 private:
  size_t params_;
  bool gradients_per_use_ = false;
  // This backward: which parameters' gradients arrived, of how many armed; the forwards since
  // the last backward; the inputs wrapped since the last backward, and how many got their
  // gradient.
  std::vector<bool> grad_ready_;
  size_t grads_seen_ = 0, grads_expected_ = 0;
  int forwards_ = 0;
  int inputs_wrapped_ = 0, inputs_grad_seen_ = 0;
};

}  // namespace fsdp::detail
