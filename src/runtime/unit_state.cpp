#include "runtime/unit_state.h"

#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "runtime/post_backward_function.h"
#include "util/check.h"
#include "util/profiler_range.h"

namespace fsdp::detail {

namespace {

std::string class_names(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  std::string out;
  for (const auto& m : modules) out += (out.empty() ? "" : ", ") + m->name();
  return out;
}

}  // namespace

UnitState::UnitState(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                     const DeviceMesh& mesh, FullyShardOptions options,
                     std::vector<std::pair<std::string, at::Tensor>> params,
                     ProcessGroupPtr post_forward, const std::vector<int>& shard_dims)
    : modules_(modules.begin(), modules.end()),
      options_(std::move(options)),
      tree_(std::make_shared<Tree>()),
      group_(std::make_shared<ParamGroup>(std::move(params), mesh, options_.mp_policy,
                                          std::move(post_forward), class_names(modules),
                                          tree_->comm_ptr(), options_.offload_policy, shard_dims)) {
  group_->settings().reshard_after_forward = options_.reshard_after_forward;
  group_->set_gradients_per_use(options_.activation_checkpointing);
  join(tree_);  // a tree of its own (a unit used alone, or before its root's lazy init)
}

void UnitState::join(std::shared_ptr<Tree> tree) {
  tree_ = std::move(tree);
  group_->use_comm(tree_->comm_ptr());
  // Any gradient the group's hooks take starts this tree's backward (queues its callback).
  // Weakly: the unit holds the tree, the group must not.
  std::weak_ptr<Tree> weak = tree_;
  group_->set_on_grad_hook([weak] {
    if (auto t = weak.lock()) t->on_backward_hook();
  });
}

void UnitState::adopt(const std::shared_ptr<UnitState>& child) {
  child->has_parent_ = true;
  child->group_->set_nested();
  children_.push_back(child);
}

void UnitState::set_name(const std::string& name) {
  name_ = name;
  group_->set_unit_name(name);
}

std::vector<std::shared_ptr<torch::nn::Module>> UnitState::modules() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  for (const auto& w : modules_) {
    if (auto m = w.lock()) out.push_back(std::move(m));
  }
  return out;
}

bool UnitState::has_module(const torch::nn::Module* m) const {
  for (const auto& w : modules_) {
    if (auto own = w.lock(); own && own.get() == m) return true;
  }
  return false;
}

std::string UnitState::describe() const {
  std::string cls;
  for (const auto& w : modules_) {
    auto m = w.lock();
    cls += (cls.empty() ? "" : ", ") + (m ? m->name() : std::string("destroyed module"));
  }
  return name_.empty() ? fmt::format("unit {}", cls) : fmt::format("unit '{}' ({})", name_, cls);
}

// --- forward ----------------------------------------------------------------------------------

void UnitState::pre_forward() {
  FSDP_RANGE(group_->range_names().pre_forward);
  Tree& tree = *tree_;
  // A later member of a unit of several modules: the unit's pre-forward ran with the first.
  if (modules_.size() > 1 && tree.recompute_depth() == 0) {
    if (group_open_) return;
    group_open_ = true;
  }
  if (tree.recompute_depth() > 0) {
    // Inside a checkpointed unit's recompute: gather for the backward that follows; the
    // forward order (prefetch) and the unit's place in this backward (its training state)
    // belong to the real forward and backward.
    group_->pre_recompute(/*arm_hooks=*/at::GradMode::is_enabled());
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
  group_->pre_forward();
  // Forward prefetch: the next unit starts gathering now, so that its all-gather overlaps this
  // unit's compute: the ones set_modules_to_forward_prefetch named, else the unit that ran next
  // in the last step.
  if (prefetch_.explicit_forward) {
    prefetch(prefetch_.forward);
  } else if (UnitState* next = tree.forward_successor(this)) {
    next->group().unshard();
  }
}

void UnitState::prefetch(const std::vector<std::weak_ptr<UnitState>>& units) {
  for (const auto& w : units) {
    if (auto u = w.lock()) u->group().unshard();
  }
}

at::Tensor UnitState::prepare_input(const at::Tensor& input) {
  if (!input.defined()) return input;
  at::Tensor x = input;
  const auto& mp = options_.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype && x.is_floating_point() &&
      x.scalar_type() != *mp.param_dtype) {
    x = x.to(*mp.param_dtype);
  }
  if (at::GradMode::is_enabled() && x.requires_grad() && tree().recompute_depth() == 0) {
    group_->input_wrapped();
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
  if (tree().recompute_depth() == 0) tree().note_output(output);
  return true;
}

void UnitState::post_forward(bool hooked_outputs, const torch::nn::Module* member) {
  FSDP_RANGE(group_->range_names().post_forward);
  Tree& tree = *tree_;
  // In a recompute the backward follows at once: keep the parameters, leave the order and the
  // training state alone.
  if (tree.recompute_depth() > 0) return;
  if (modules_.size() > 1) {
    // A unit of several modules completes after every member ran (a member run twice counts
    // once); one that some member skipped completes at the end of the root's forward.
    members_ran_.resize(modules_.size(), false);
    size_t index = 0;
    for (size_t i = 0; i < modules_.size(); ++i) {
      if (auto m = modules_[i].lock(); m && m.get() == member) index = i;
    }
    members_ran_[index] = true;
    members_hooked_ = members_hooked_ && hooked_outputs;
    for (bool ran : members_ran_) {
      if (!ran) return;
    }
    hooked_outputs = members_hooked_;
    close_group();
  }
  complete_forward(hooked_outputs);
}

void UnitState::close_group() {
  group_open_ = false;
  members_ran_.assign(members_ran_.size(), false);
  members_hooked_ = true;
}

void UnitState::complete_forward(bool hooked_outputs) {
  Tree& tree = *tree_;
  const bool grad_mode = at::GradMode::is_enabled();
  if (is_root()) {
    // Units of several modules that some member skipped in this forward complete now.
    for (UnitState* u : tree.units()) {
      if (u == this || !u->group_open_) continue;
      const bool hooked = u->members_hooked_;
      u->close_group();
      u->complete_forward(hooked);
    }
  }
  if (is_root() && grad_mode) check_checkpointed_units_ran(tree);
  post_forward_index_ = tree.record_post_forward(this);
  // Outputs the backward cannot find this unit through (not tensors) keep the parameters
  // until the end of backward, which reshards them.
  group_->post_forward(!grad_mode       ? AfterForward::kFree
                       : hooked_outputs ? AfterForward::kAsSet
                                        : AfterForward::kKeep);
  if (is_root()) tree.end_forward(grad_mode);
}

void UnitState::forward_failed() {
  Tree& tree = *tree_;
  if (tree.recompute_depth() > 0) return;  // the backward fails with it; reset follows
  close_group();
  group_->post_forward(AfterForward::kFree);
  // The root's forward is the step's: nothing of it can be backpropagated.
  if (is_root()) tree.reset();
}

bool UnitState::checkpoints_forward() const {
  return options_.activation_checkpointing && at::GradMode::is_enabled();
}

void UnitState::begin_recompute() {
  group_->pre_recompute(/*arm_hooks=*/true);
  tree_->enter_recompute();
}

void UnitState::end_recompute() { tree_->leave_recompute(); }

void UnitState::check_checkpointed_units_ran(const Tree& tree) {
  for (const UnitState* u : tree.units()) {
    if (!u->options_.activation_checkpointing || tree.ran_this_forward(u)) continue;
    if (u->group_->params_in_foreign_graph()) {
      throw InvalidArgument(fmt::format(
          "fsdp: {} has activation_checkpointing on, but its module ran in this forward "
          "without its fsdp::Unit (its parameters are in the graph, the unit never ran): "
          "call the unit, unit(x), not the module, unit->forward(x) or a ModuleHolder; "
          "otherwise its parameters are not gathered and its activations not checkpointed",
          u->describe()));
    }
  }
}

// --- backward ---------------------------------------------------------------------------------

void UnitState::pre_backward() {
  Tree& tree = *tree_;
  tree.on_backward_hook();
  // Once per backward (the group knows): several outputs each run this hook.
  if (group_->training_state() == TrainingState::kPreBackward ||
      group_->training_state() == TrainingState::kPostBackward) {
    return;
  }
  FSDP_RANGE(group_->range_names().pre_backward);
  group_->pre_backward();
  // Backward prefetch: backward visits units in reverse post-forward order; start the gather
  // of the next one while this one computes (or of the ones set_modules_to_backward_prefetch
  // named).
  if (prefetch_.explicit_backward) {
    prefetch(prefetch_.backward);
  } else if (UnitState* prev = tree.post_forward_predecessor(post_forward_index_)) {
    const TrainingState t = prev->group().training_state();
    if (prev != this && t != TrainingState::kPreBackward && t != TrainingState::kPostBackward) {
      prev->group().unshard();
    }
  }
}

void UnitState::on_input_grad() { group_->input_grad_arrived(); }

void UnitState::end_backward() {
  close_group();
  group_->finalize_backward();
}

void UnitState::reset_step() {
  close_group();
  group_->reset();
  post_forward_index_ = -1;
}

// --- FSDPModule ---------------------------------------------------------------------------------

MemoryStats UnitState::memory_stats() const {
  MemoryStats m;
  std::vector<const UnitState*> todo{this};
  for (size_t i = 0; i < todo.size(); ++i) {
    for (const auto& p : todo[i]->group_->params()) {
      m.sharded_param_bytes += p.shard_bytes();
      m.sharded_grad_bytes += p.sharded_grad_bytes();
      m.unsharded_grad_bytes += p.kept_grad_bytes();
    }
    for (const auto& c : todo[i]->children_) todo.push_back(c.get());
  }
  const CommContext& comm = group_->comm();
  m.tree.full_param_bytes = comm.full_bytes();
  m.tree.peak_full_param_bytes = comm.peak_full_bytes();
  m.tree.comm_buffer_bytes = comm.comm_bytes();
  m.tree.peak_comm_buffer_bytes = comm.peak_comm_bytes();
  m.tree.cached_buffer_bytes = comm.cached_bytes();
  // 0.1.0's names of the same figures (deprecated: stats.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  m.full_param_bytes = m.tree.full_param_bytes;
  m.peak_full_param_bytes = m.tree.peak_full_param_bytes;
  m.comm_buffer_bytes = m.tree.comm_buffer_bytes;
  m.peak_comm_buffer_bytes = m.tree.peak_comm_buffer_bytes;
  m.cached_buffer_bytes = m.tree.cached_buffer_bytes;
#pragma GCC diagnostic pop
  return m;
}

}  // namespace fsdp::detail
