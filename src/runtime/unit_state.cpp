#include "runtime/unit_state.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "runtime/post_backward_function.h"
#include "tools/range.h"
#include "util/check.h"

namespace fsdp::detail {

UnitState::UnitState(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
                     FullyShardOptions options,
                     std::vector<std::pair<std::string, at::Tensor>> params,
                     ProcessGroupPtr post_forward)
    : module_(module),
      options_(std::move(options)),
      group_(std::move(params), mesh, options_.mp_policy, std::move(post_forward), module->name()),
      tree_(std::make_shared<Tree>()) {
  settings_.reshard_after_forward = options_.reshard_after_forward;
}

void UnitState::adopt(const std::shared_ptr<UnitState>& child) {
  child->has_parent_ = true;
  children_.push_back(child);
}

void UnitState::set_name(const std::string& name) {
  name_ = name;
  group_.set_unit_name(name);
}

std::string UnitState::describe() const {
  auto m = module();
  const std::string cls = m ? m->name() : "destroyed module";
  return name_.empty() ? fmt::format("unit {}", cls) : fmt::format("unit '{}' ({})", name_, cls);
}

bool UnitState::reshard_after_forward() const {
  return settings_.reshard_after_forward.value_or(has_parent_ ||
                                                  options_.reshard_after_forward_ranks > 0);
}

// --- forward ----------------------------------------------------------------------------------

void UnitState::pre_forward() {
  FSDP_RANGE(group_.range_names().pre_forward);
  Tree& tree = *tree_;
  Accounting& acct = tree.acct();
  if (tree.recompute_depth() > 0) {
    // Inside a checkpointed unit's recompute: gather for the backward that follows; the
    // forward order (prefetch) belongs to the real forward.
    group_.wait_unshard(acct);
    if (at::GradMode::is_enabled()) arm_grad_hooks();
    return;
  }
  if (is_root()) {
    if (!tree.initialised()) tree.init(*this);
    tree.begin_forward();
  } else {
    FSDP_CHECK_ARG(tree.initialised(),
                   "fsdp: {} was called before the root was set up; call the root (the "
                   "outermost fully_shard unit) so that its forward runs the inner units",
                   describe());
  }
  tree.record_pre_forward(this);
  group_.wait_unshard(acct);
  if (at::GradMode::is_enabled()) arm_grad_hooks();
  // Forward prefetch: the next unit starts gathering now, so that its all-gather overlaps this
  // unit's compute: the ones set_modules_to_forward_prefetch named, else the unit that ran next
  // in the last step.
  if (settings_.explicit_forward_prefetch) {
    prefetch(settings_.forward_prefetch);
  } else if (UnitState* next = tree.forward_successor(this)) {
    next->unshard_async();
  }
}

void UnitState::prefetch(const std::vector<std::weak_ptr<UnitState>>& units) {
  for (const auto& w : units) {
    if (auto u = w.lock()) u->unshard_async();
  }
}

void UnitState::arm_grad_hooks() {
  std::weak_ptr<UnitState> self = weak_from_this();
  grads_expected_ = group_.arm_grad_hooks([self](size_t i, const at::Tensor& grad) {
    if (auto s = self.lock()) s->on_param_grad(i, grad);
  });
}

at::Tensor UnitState::prepare_input(const at::Tensor& input) {
  if (!input.defined()) return input;
  at::Tensor x = input;
  const auto& mp = options_.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype && x.is_floating_point() &&
      x.scalar_type() != *mp.param_dtype) {
    x = x.to(*mp.param_dtype);
  }
  if (at::GradMode::is_enabled() && x.requires_grad() && tree_->recompute_depth() == 0) {
    ++backward_.inputs_wrapped;
    std::weak_ptr<UnitState> self = weak_from_this();
    x = attach_post_backward(x, [self] {
      if (auto s = self.lock()) s->on_input_grad();
    });
  }
  return x;
}

bool UnitState::prepare_output(at::Tensor& output) {
  if (!output.defined()) return false;
  const auto& mp = options_.mp_policy;
  if (mp.output_dtype && output.is_floating_point() && output.scalar_type() != *mp.output_dtype) {
    output = output.to(*mp.output_dtype);
  }
  if (!output.requires_grad()) return false;
  std::weak_ptr<UnitState> self = weak_from_this();
  output.register_hook([self](const at::Tensor&) {
    if (auto s = self.lock()) s->pre_backward();
  });
  if (tree_->recompute_depth() == 0) tree_->note_output(output);
  return true;
}

void UnitState::post_forward(bool hooked_outputs) {
  FSDP_RANGE(group_.range_names().post_forward);
  Tree& tree = *tree_;
  // In a recompute the backward follows at once: keep the parameters, leave the order alone.
  if (tree.recompute_depth() > 0) return;
  const bool grad_mode = at::GradMode::is_enabled();
  if (is_root() && grad_mode) check_checkpointed_units_ran();
  post_forward_index_ = tree.record_post_forward(this);
  // Outputs the backward cannot find this unit through (not tensors) keep the parameters
  // until the end of backward, which reshards them.
  if (!grad_mode) {
    group_.reshard(tree.acct());
  } else if (hooked_outputs && reshard_after_forward()) {
    if (options_.reshard_after_forward_ranks > 0) {
      group_.reshard_to_post_forward(tree.acct());
    } else {
      group_.reshard(tree.acct());
    }
  }
  if (is_root()) tree.end_forward(grad_mode);
}

void UnitState::forward_failed() {
  Tree& tree = *tree_;
  if (tree.recompute_depth() > 0) return;  // the backward fails with it; reset follows
  group_.reshard(tree.acct());
  // The root's forward is the step's: nothing of it can be backpropagated.
  if (is_root()) tree.reset();
}

bool UnitState::checkpoints_forward() const {
  return options_.activation_checkpointing && at::GradMode::is_enabled();
}

void UnitState::begin_recompute() {
  group_.wait_unshard(tree_->acct());
  arm_grad_hooks();
  tree_->enter_recompute();
}

void UnitState::end_recompute() { tree_->leave_recompute(); }

void UnitState::check_checkpointed_units_ran() const {
  const Tree& tree = *tree_;
  for (const UnitState* u : tree.units()) {
    if (!u->options_.activation_checkpointing || tree.ran_this_forward(u)) continue;
    for (const auto& p : u->group_.params()) {
      // An accumulator alive but not ours: some live graph uses the parameter directly.
      auto node = torch::autograd::impl::try_get_grad_accumulator(p.param());
      if (node && !p.hooked(node)) {
        throw InvalidArgument(fmt::format(
            "fsdp: {} has activation_checkpointing on, but its module ran in this forward "
            "without its fsdp::Unit (its parameters are in the graph, the unit never ran): "
            "call the unit, unit(x), not the module, unit->forward(x) or a ModuleHolder; "
            "otherwise its parameters are not gathered and its activations not checkpointed",
            u->describe()));
      }
    }
  }
}

// --- backward ---------------------------------------------------------------------------------

void UnitState::pre_backward() {
  tree_->on_backward_hook();
  if (backward_.pre_backward_done) return;
  FSDP_RANGE(group_.range_names().pre_backward);
  backward_.pre_backward_done = true;
  Accounting& acct = tree_->acct();
  group_.wait_unshard(acct);
  // Backward prefetch: backward visits units in reverse post-forward order; start the gather
  // of the next one while this one computes (or of the ones set_modules_to_backward_prefetch
  // named).
  if (settings_.explicit_backward_prefetch) {
    prefetch(settings_.backward_prefetch);
  } else if (UnitState* prev = tree_->post_forward_predecessor(post_forward_index_)) {
    if (prev != this && !prev->backward_.pre_backward_done) prev->unshard_async();
  }
}

void UnitState::on_input_grad() {
  // Gradients reached this unit's inputs: its backward is over.
  if (++backward_.inputs_grad_seen == backward_.inputs_wrapped) run_post_backward();
}

void UnitState::on_param_grad(size_t index, const at::Tensor& grad) {
  tree_->on_backward_hook();
  auto& bw = backward_;
  group_.params()[index].capture_full_grad(grad);
  if (bw.grad_ready.size() <= index) bw.grad_ready.resize(index + 1, false);
  if (bw.grad_ready[index]) return;
  bw.grad_ready[index] = true;
  // All gradients present is the end of this unit's backward only when every parameter takes
  // a gradient: a frozen weight may still be read to compute input gradients after that (the
  // post-backward function on the unit's inputs covers that case).
  if (++bw.grads_seen == grads_expected_ && grads_expected_ == group_.params().size()) {
    run_post_backward();
  }
}

void UnitState::run_post_backward() {
  if (backward_.post_backward_done) return;
  FSDP_RANGE(group_.range_names().post_backward);
  backward_.post_backward_done = true;
  ReduceSettings reduce;
  reduce.reduce = settings_.requires_gradient_sync;
  reduce.all_reduce = settings_.requires_all_reduce;
  reduce.if_unused = settings_.reduce_scatter_unused_params;
  reduce.divide_factor = settings_.gradient_divide_factor;
  Tree& tree = *tree_;
  if (group_.post_backward(tree.acct(), reduce, settings_.reshard_after_backward)) {
    tree.track_reduction(&group_);
  }
}

void UnitState::end_backward(bool reshard) {
  group_.end_backward();
  if (reshard) group_.reshard(tree_->acct());
  backward_ = BackwardState{};
}

void UnitState::reset_step() {
  group_.drop_backward();
  group_.reshard(tree_->acct());
  backward_ = BackwardState{};
  post_forward_index_ = -1;
}

// --- FSDPModule -----------------------------------------------------------------------------

void UnitState::unshard_async() { group_.unshard_async(tree_->acct()); }

void UnitState::wait_unshard() { group_.wait_unshard(tree_->acct()); }

void UnitState::reshard() { group_.reshard(tree_->acct()); }

MemoryStats UnitState::memory_stats() const {
  MemoryStats m;
  std::vector<const UnitState*> todo{this};
  for (size_t i = 0; i < todo.size(); ++i) {
    for (const auto& p : todo[i]->group_.params()) {
      m.sharded_param_bytes += p.shard_bytes();
      m.sharded_grad_bytes += p.sharded_grad_bytes();
      m.unsharded_grad_bytes += p.kept_grad_bytes();
    }
    for (const auto& c : todo[i]->children_) todo.push_back(c.get());
  }
  const Accounting& acct = tree_->acct();
  m.tree.full_param_bytes = acct.full_bytes;
  m.tree.peak_full_param_bytes = acct.peak_full_bytes;
  m.tree.comm_buffer_bytes = acct.comm_bytes;
  m.tree.peak_comm_buffer_bytes = acct.peak_comm_bytes;
  m.tree.cached_buffer_bytes = acct.pool->pooled_bytes();
  return m;
}

}  // namespace fsdp::detail
