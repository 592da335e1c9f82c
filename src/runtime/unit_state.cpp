#include "runtime/unit_state.h"

#include <torch/csrc/autograd/engine.h>

#include <algorithm>

#include "fsdp/errors.h"
#include "runtime/post_backward_function.h"

namespace fsdp::detail {

UnitState::UnitState(const std::shared_ptr<torch::nn::Module>& module, ProcessGroupPtr pg,
                     FullyShardOptions options,
                     std::vector<std::pair<std::string, at::Tensor>> params)
    : module_(module), options_(std::move(options)) {
  group_ = std::make_shared<ParamGroup>(std::move(params), std::move(pg), options_.mp_policy);
}

bool UnitState::module_is(const torch::nn::Module* m) const {
  auto alive = module_.lock();
  return alive && alive.get() == m;
}

void UnitState::adopt(const std::shared_ptr<UnitState>& child) {
  child->has_parent_ = true;
  children_.push_back(child);
}

UnitState& UnitState::root() const {
  auto r = root_.lock();
  if (!r) {
    throw InvalidArgument(
        "fsdp: a unit inside a fully_shard root was called before the root was set up; call "
        "the root (the outermost fully_shard unit) so that its forward runs the inner units");
  }
  return *r;
}

std::vector<UnitState*> UnitState::collect_tree() {
  std::vector<UnitState*> out{this};
  for (size_t i = 0; i < out.size(); ++i) {
    for (auto& c : out[i]->children_) out.push_back(c.get());
  }
  return out;
}

void UnitState::lazy_init() {
  tree_ = collect_tree();
  int world = group_->pg()->size();
  for (UnitState* s : tree_) {
    if (s->group_->pg()->size() != world) {
      throw InvalidArgument(fmt::format(
          "fsdp: units of one root must share a world size: the root's group has {} ranks, an "
          "inner unit's has {}",
          world, s->group_->pg()->size()));
    }
    s->root_ = weak_from_this();
    s->acct_ = acct_;  // one tree, one set of counters
  }
  initialised_ = true;
}

bool UnitState::reshard_after_forward() const {
  return options_.reshard_after_forward.value_or(has_parent_);
}

void UnitState::pre_forward() {
  if (!has_parent_) {
    if (!initialised_) lazy_init();
    last_forward_order_ = std::move(forward_order_);
    forward_order_.clear();
    post_forward_order_.clear();
  }
  UnitState& r = root();
  r.forward_order_.push_back(this);
  group_->wait_unshard(*acct_);
  if (at::GradMode::is_enabled()) {
    auto self = weak_from_this();
    group_->arm_grad_hooks([self](size_t i) {
      if (auto s = self.lock()) s->on_param_grad(i);
    });
  }
  // Forward prefetch: the unit that ran next in the previous step starts gathering now, so
  // its all-gather overlaps this unit's compute.
  size_t pos = r.forward_order_.size();
  if (pos < r.last_forward_order_.size()) {
    UnitState* next = r.last_forward_order_[pos];
    if (next != this) next->group_->unshard_async(*acct_);
  }
  // Per-backward counters (pre_backward_done_, inputs_*) are reset by the end-of-backward
  // callback, not here: several forwards may feed one backward.
}

at::Tensor UnitState::cast_input(const at::Tensor& input) {
  if (!input.defined()) return input;
  at::Tensor x = input;
  const auto& mp = options_.mp_policy;
  if (mp.cast_forward_inputs && mp.param_dtype && x.is_floating_point() &&
      x.scalar_type() != *mp.param_dtype) {
    x = x.to(*mp.param_dtype);
  }
  if (at::GradMode::is_enabled() && x.requires_grad()) {
    ++inputs_wrapped_;
    auto self = weak_from_this();
    x = attach_post_backward(x, [self] {
      if (auto s = self.lock()) s->on_input_grad();
    });
  }
  return x;
}

void UnitState::on_input_grad() {
  // Gradients reached this unit's inputs: its backward is over.
  if (++inputs_grad_seen_ == inputs_wrapped_) run_post_backward();
}

void UnitState::run_post_backward() {
  if (group_->post_backward(*acct_)) root().track_reduction(group_.get());
}

namespace {
// One reduce-scatter may run while the next unit's backward computes; older ones are waited
// for, so gradient buffers of at most two units are alive at once.
constexpr size_t kMaxReductionsInFlight = 1;
}  // namespace

void UnitState::track_reduction(ParamGroup* group) {
  reductions_in_flight_.push_back(group);
  while (reductions_in_flight_.size() > kMaxReductionsInFlight) {
    reductions_in_flight_.front()->finish_reduce(*acct_);
    reductions_in_flight_.pop_front();
  }
}

void UnitState::hook_output(at::Tensor& output) {
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
  UnitState& r = root();
  post_forward_index_ = static_cast<int>(r.post_forward_order_.size());
  r.post_forward_order_.push_back(this);
  if (reshard_after_forward() || !at::GradMode::is_enabled()) group_->reshard(*acct_);
}

void UnitState::pre_backward() {
  UnitState& r = root();
  r.ensure_final_callback();
  if (pre_backward_done_) return;
  pre_backward_done_ = true;
  group_->wait_unshard(*acct_);
  // Backward prefetch: backward visits units in reverse post-forward order; start the gather
  // of the next one while this one computes.
  if (post_forward_index_ > 0 &&
      post_forward_index_ <= static_cast<int>(r.post_forward_order_.size())) {
    UnitState* prev = r.post_forward_order_[post_forward_index_ - 1];
    if (prev != this && !prev->pre_backward_done_) prev->group_->unshard_async(*acct_);
  }
}

void UnitState::on_param_grad(size_t index) {
  root().ensure_final_callback();
  if (group_->on_grad_ready(index)) run_post_backward();
}

void UnitState::ensure_final_callback() {
  if (callback_queued_) return;
  callback_queued_ = true;
  auto self = weak_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([self] {
    if (auto s = self.lock()) s->final_callback();
  });
}

void UnitState::final_callback() {
  // Same order on every rank (tree order): units whose gradients were incomplete (unused or
  // frozen parameters) reduce what they have, then every reduction is waited for.
  for (UnitState* s : tree_) s->run_post_backward();
  for (ParamGroup* g : reductions_in_flight_) g->finish_reduce(*acct_);
  reductions_in_flight_.clear();
  for (UnitState* s : tree_) {
    s->group_->end_backward();
    s->group_->reshard(*acct_);
    s->pre_backward_done_ = false;
    s->inputs_wrapped_ = s->inputs_grad_seen_ = 0;
  }
  callback_queued_ = false;
}

void UnitState::unshard() { group_->wait_unshard(*acct_); }

void UnitState::reshard() { group_->reshard(*acct_); }

MemoryStats UnitState::memory_stats() const {
  MemoryStats m;
  auto add_group = [&m](const ParamGroup& g) {
    for (const auto& p : g.params()) {
      m.sharded_param_bytes += p.shard_bytes();
      m.sharded_grad_bytes += p.sharded_grad_bytes();
    }
  };
  std::vector<const UnitState*> todo{this};
  for (size_t i = 0; i < todo.size(); ++i) {
    add_group(*todo[i]->group_);
    for (auto& c : todo[i]->children_) todo.push_back(c.get());
  }
  m.full_param_bytes = acct_->full_bytes;
  m.peak_full_param_bytes = acct_->peak_full_bytes;
  m.comm_buffer_bytes = acct_->comm_bytes;
  m.peak_comm_buffer_bytes = acct_->peak_comm_bytes;
  m.exposed_comm_seconds = acct_->exposed_comm_seconds;
  m.cached_buffer_bytes = acct_->pool->pooled_bytes();
  return m;
}

}  // namespace fsdp::detail
