#include "runtime/unit_state.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "fsdp/errors.h"
#include "profile/range.h"
#include "runtime/post_backward_function.h"

namespace fsdp::detail {

UnitState::UnitState(const std::shared_ptr<torch::nn::Module>& module, ProcessGroupPtr pg,
                     ProcessGroupPtr replicate, FullyShardOptions options,
                     std::vector<std::pair<std::string, at::Tensor>> params)
    : module_(module), options_(std::move(options)) {
  group_ = std::make_shared<ParamGroup>(std::move(params), std::move(pg), std::move(replicate),
                                        options_.mp_policy);
  use_context(std::make_shared<TreeContext>());
}

void UnitState::use_context(std::shared_ptr<TreeContext> ctx) {
  ctx_ = std::move(ctx);
  group_->attach(&ctx_->acct);
}

bool UnitState::module_is(const torch::nn::Module* m) const {
  auto alive = module_.lock();
  return alive && alive.get() == m;
}

void UnitState::adopt(const std::shared_ptr<UnitState>& child) {
  child->has_parent_ = true;
  children_.push_back(child);
}

std::vector<UnitState*> UnitState::collect_tree() {
  std::vector<UnitState*> out{this};
  for (size_t i = 0; i < out.size(); ++i) {
    for (auto& c : out[i]->children_) out.push_back(c.get());
  }
  return out;
}

// FSDP2's _lazy_init / _init_shared_state: the root collects its tree, checks it, and hands
// every unit one shared context.
void UnitState::lazy_init() {
  auto tree = collect_tree();
  int world = group_->pg()->size();
  for (UnitState* s : tree) {
    if (s->group_->pg()->size() != world) {
      throw InvalidArgument(fmt::format(
          "fsdp: units of one root must share a world size: the root's group has {} ranks, an "
          "inner unit's has {}",
          world, s->group_->pg()->size()));
    }
  }
  ctx_->units = tree;
  for (UnitState* s : tree) s->use_context(ctx_);
  // Names for messages: each unit's module path in the root.
  if (auto root = module()) {
    for (const auto& item : root->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      for (UnitState* s : tree) {
        if (s->module_is(item.value().get())) {
          s->name_ = item.key().empty() ? "(root)" : item.key();
          s->group_->set_unit_name(s->name_);
        }
      }
    }
  }
  initialised_ = true;
}

std::string UnitState::describe() const {
  auto m = module();
  const std::string cls = m ? m->name() : "destroyed module";
  return name_.empty() ? fmt::format("unit {}", cls) : fmt::format("unit '{}' ({})", name_, cls);
}

bool UnitState::reshard_after_forward() const {
  return options_.reshard_after_forward.value_or(has_parent_);
}

void UnitState::pre_forward() {
  FSDP_RANGE(group_->range_names().pre_forward);
  if (ctx_->recompute_depth > 0) {
    // Inside a checkpointed unit's recompute: gather for the backward that follows; the
    // forward order (prefetch) belongs to the real forward.
    group_->wait_unshard();
    if (at::GradMode::is_enabled()) arm_grad_hooks();
    return;
  }
  if (is_root()) {
    if (!initialised_) lazy_init();
    ctx_->last_forward_order = std::move(ctx_->forward_order);
    ctx_->forward_order.clear();
    ctx_->post_forward_order.clear();
  } else if (ctx_->units.empty()) {
    throw InvalidArgument(
        "fsdp: a unit inside a fully_shard root was called before the root was set up; call "
        "the root (the outermost fully_shard unit) so that its forward runs the inner units");
  }
  TreeContext& ctx = *ctx_;
  ctx.forward_order.push_back(this);
  group_->wait_unshard();
  if (at::GradMode::is_enabled()) arm_grad_hooks();
  // Forward prefetch: the unit that ran next in the previous step starts gathering now, so
  // its all-gather overlaps this unit's compute.
  size_t pos = ctx.forward_order.size();
  if (pos < ctx.last_forward_order.size()) {
    UnitState* next = ctx.last_forward_order[pos];
    if (next != this) next->group_->unshard_async();
  }
}

void UnitState::arm_grad_hooks() {
  auto self = weak_from_this();
  grads_expected_ = group_->arm_grad_hooks([self](size_t i) {
    if (auto s = self.lock()) s->on_param_grad(i);
  });
}

at::Tensor UnitState::cast_forward_input(const at::Tensor& input) {
  if (!input.defined()) return input;
  at::Tensor x = input;
  const auto& mp = options_.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype && x.is_floating_point() &&
      x.scalar_type() != *mp.param_dtype) {
    x = x.to(*mp.param_dtype);
  }
  if (at::GradMode::is_enabled() && x.requires_grad()) {
    ++backward_.inputs_wrapped;
    auto self = weak_from_this();
    x = attach_post_backward(x, [self] {
      if (auto s = self.lock()) s->on_input_grad();
    });
  }
  return x;
}

void UnitState::on_input_grad() {
  // Gradients reached this unit's inputs: its backward is over.
  if (++backward_.inputs_grad_seen == backward_.inputs_wrapped) run_post_backward();
}

void UnitState::run_post_backward() {
  if (backward_.post_backward_done) return;
  FSDP_RANGE(group_->range_names().post_backward);
  backward_.post_backward_done = true;
  if (group_->post_backward(requires_gradient_sync_)) track_reduction(group_.get());
}

void UnitState::track_reduction(ParamGroup* group) {
  // One reduce-scatter may run while the next unit's backward computes; older ones are waited
  // for. With hybrid sharding the previous unit's all-reduce across replicas may run as well
  // (on the replicate group, beside this reduce-scatter on the shard group): the unit before
  // the newest moves on to its all-reduce instead of finishing (returning its reduce-scatter's
  // input to the pool), and older ones finish. So the gradient buffers of at most two units
  // are alive at once, and with hybrid sharding a third unit's reduced shard.
  auto& in_flight = ctx_->reductions_in_flight;
  in_flight.push_back(group);
  while (in_flight.size() > 1) {
    ParamGroup* oldest = in_flight.front();
    if (in_flight.size() == 2 && oldest->reduce_scatter_in_flight() && oldest->hybrid()) {
      oldest->start_all_reduce();
      break;
    }
    oldest->finish_reduce();
    in_flight.pop_front();
  }
}

void UnitState::post_forward_output(at::Tensor& output) {
  if (!output.defined()) return;
  const auto& mp = options_.mp_policy;
  if (mp.output_dtype && output.is_floating_point() && output.scalar_type() != *mp.output_dtype) {
    output = output.to(*mp.output_dtype);
  }
  if (!output.requires_grad()) return;
  auto self = weak_from_this();
  output.register_hook([self](const at::Tensor&) {
    if (auto s = self.lock()) s->pre_backward();
  });
}

void UnitState::post_forward() {
  FSDP_RANGE(group_->range_names().post_forward);
  // In a recompute the backward follows at once: keep the parameters, leave the order alone.
  if (ctx_->recompute_depth > 0) return;
  if (is_root() && at::GradMode::is_enabled()) check_checkpointed_units_ran();
  auto& order = ctx_->post_forward_order;
  post_forward_index_ = static_cast<int>(order.size());
  order.push_back(this);
  if (reshard_after_forward() || !at::GradMode::is_enabled()) group_->reshard();
}

void UnitState::pre_backward() {
  ensure_final_callback();
  if (backward_.pre_backward_done) return;
  FSDP_RANGE(group_->range_names().pre_backward);
  backward_.pre_backward_done = true;
  group_->wait_unshard();
  // Backward prefetch: backward visits units in reverse post-forward order; start the gather
  // of the next one while this one computes.
  const auto& order = ctx_->post_forward_order;
  if (post_forward_index_ > 0 && post_forward_index_ <= static_cast<int>(order.size())) {
    UnitState* prev = order[post_forward_index_ - 1];
    if (prev != this && !prev->backward_.pre_backward_done) prev->group_->unshard_async();
  }
}

void UnitState::on_param_grad(size_t index) {
  ensure_final_callback();
  auto& bw = backward_;
  if (bw.grad_ready.size() <= index) bw.grad_ready.resize(index + 1, false);
  if (bw.grad_ready[index]) return;
  bw.grad_ready[index] = true;
  // All gradients present is the end of this unit's backward only when every parameter takes
  // a gradient: a frozen weight may still be read to compute input gradients after that (the
  // post-backward function on the unit's inputs covers that case).
  if (++bw.grads_seen == grads_expected_ && grads_expected_ == group_->params().size()) {
    run_post_backward();
  }
}

void UnitState::ensure_final_callback() {
  if (ctx_->final_callback_queued) return;
  ctx_->final_callback_queued = true;
  // Whichever unit's hook queues it, the callback finishes the whole tree, from the root.
  UnitState* head = ctx_->units.empty() ? this : ctx_->units.front();
  std::weak_ptr<UnitState> root = head->weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([root] {
    if (auto r = root.lock()) r->final_callback();
  });
}

void UnitState::final_callback() {
  FSDP_RANGE("fsdp::end_of_backward");
  TreeContext& ctx = *ctx_;
  // Same order on every rank (tree order): units whose gradients were incomplete (unused or
  // frozen parameters) reduce what they have, then every reduction is waited for.
  for (UnitState* s : ctx.units) s->run_post_backward();
  for (ParamGroup* g : ctx.reductions_in_flight) g->finish_reduce();
  ctx.reductions_in_flight.clear();
  for (UnitState* s : ctx.units) {
    s->group_->end_backward();
    s->group_->reshard();
    s->backward_ = BackwardState{};
  }
  ctx.final_callback_queued = false;
}

void UnitState::check_checkpointed_units_ran() const {
  const auto& ran = ctx_->forward_order;
  for (const UnitState* u : ctx_->units) {
    if (!u->options_.activation_checkpointing ||
        std::find(ran.begin(), ran.end(), u) != ran.end()) {
      continue;
    }
    for (const auto& p : u->group_->params()) {
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

void UnitState::set_requires_gradient_sync(bool sync, bool recurse) {
  std::vector<UnitState*> units = recurse ? collect_tree() : std::vector<UnitState*>{this};
  // Checked for all before any changes: a half-applied switch would desynchronise ranks.
  // A backward is running when the tree queued its end-of-backward callback, or when this
  // thread is inside any autograd graph task (a hook that runs before the tree's first one).
  const bool in_graph_task = torch::autograd::get_current_graph_task_id() != -1;
  for (UnitState* u : units) {
    if (in_graph_task || u->ctx_->final_callback_queued) {
      throw InvalidArgument(fmt::format(
          "fsdp: set_requires_gradient_sync({}) on {} while a backward of its tree is running "
          "(called from a hook?); call it before the forward of the micro-batch it applies to",
          sync, u->describe()));
    }
  }
  for (UnitState* u : units) u->requires_gradient_sync_ = sync;
}

bool UnitState::checkpoints_forward() const {
  return options_.activation_checkpointing && at::GradMode::is_enabled();
}

void UnitState::begin_recompute() {
  group_->wait_unshard();
  arm_grad_hooks();
  ++ctx_->recompute_depth;
}

void UnitState::end_recompute() { --ctx_->recompute_depth; }

void UnitState::unshard() { group_->wait_unshard(); }

void UnitState::reshard() { group_->reshard(); }

MemoryStats UnitState::memory_stats() const {
  MemoryStats m;
  std::vector<const UnitState*> todo{this};
  for (size_t i = 0; i < todo.size(); ++i) {
    for (const auto& p : todo[i]->group_->params()) {
      m.sharded_param_bytes += p.shard_bytes();
      m.sharded_grad_bytes += p.sharded_grad_bytes();
      m.unsharded_grad_bytes += p.unsharded_grad_bytes();
    }
    for (auto& c : todo[i]->children_) todo.push_back(c.get());
  }
  const Accounting& acct = ctx_->acct;
  m.full_param_bytes = acct.full_bytes;
  m.peak_full_param_bytes = acct.peak_full_bytes;
  m.comm_buffer_bytes = acct.comm_bytes;
  m.peak_comm_buffer_bytes = acct.peak_comm_bytes;
  m.cached_buffer_bytes = acct.pool->pooled_bytes();
  return m;
}

}  // namespace fsdp::detail
