#include "runtime/param_group.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "runtime/all_gather.h"
#include "util/check.h"

namespace fsdp::detail {
namespace {

// Runs before autograd's accumulator of a parameter: hands the gradient to its group, and the
// accumulator nothing (an undefined gradient, which AccumulateGrad skips) when the group took
// it, so that grad() keeps the sharded gradient (fsdp_param.h).
class CaptureGradHook final : public torch::autograd::FunctionPreHook {
 public:
  CaptureGradHook(std::weak_ptr<ParamGroup> group, size_t index)
      : group_(std::move(group)), index_(index) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (grads.empty() || !grads[0].defined()) return grads;
    auto group = group_.lock();
    if (!group || !group->take_param_grad(index_, grads[0])) return grads;
    return {at::Tensor()};
  }

 private:
  std::weak_ptr<ParamGroup> group_;
  size_t index_;
};

}  // namespace

ParamGroup::ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params,
                       const DeviceMesh& mesh, MixedPrecisionPolicy mp,
                       ProcessGroupPtr post_forward, const std::string& owner,
                       std::shared_ptr<CommContext> comm, std::optional<CPUOffloadPolicy> offload,
                       const std::vector<int>& shard_dims)
    : pg_(mesh.shard),
      replicate_(mesh.replicate),
      range_names_(std::make_shared<UnitRangeNames>()),
      comm_(std::move(comm)),
      post_forward_(std::move(post_forward)),
      backward_end_(params.size()) {
  at::ScalarType orig = params.empty() ? at::kFloat : params.front().second.scalar_type();
  compute_dtype_ = mp.param_dtype.value_or(orig);
  reduce_dtype_ = mp.reduce_dtype.value_or(compute_dtype_);
  params_.reserve(params.size());  // FsdpParam addresses stay fixed: reductions refer to them
  for (size_t i = 0; i < params.size(); ++i) {
    params_.emplace_back(params[i].second, pg_, replicate_, compute_dtype_, owner, offload,
                         i < shard_dims.size() ? shard_dims[i] : 0);
  }
  gather_layout_ = flat_layout(shapes(), pg_->size());
  for (const auto& p : params_) trainable_.push_back(p.requires_grad());
  reduce_layout_ = flat_layout(shapes(), pg_->size(), trainable_);
  if (post_forward_) post_forward_layout_ = flat_layout(shapes(), post_forward_->size());
  // One rank holding everything in its own dtype: the shard is the full parameter and autograd's
  // gradient is already the reduced one, so no copy and no collective is needed.
  // (With replicas the gradient still has to be averaged across them; with offload the shard
  // is in host memory and the unit computes on the device.)
  offload_ = offload.has_value();
  pin_host_ = offload_ && offload->pin_memory;
  params_pass_through_ = pg_->size() == 1 && !replicate_ && compute_dtype_ == orig &&
                         reduce_dtype_ == orig && !offload_;
}

void ParamGroup::set_unit_name(const std::string& name) {
  range_names_ = std::make_shared<UnitRangeNames>(name);
}

std::vector<ParamShape> ParamGroup::shapes() const {
  std::vector<ParamShape> out;
  for (const auto& p : params_) out.push_back(p.shape());
  return out;
}

at::TensorOptions ParamGroup::buffer_options(at::ScalarType dtype) const {
  // The group's device, with its index (a rank's GPU), not the current device.
  return at::TensorOptions().dtype(dtype).device(pg_->device());
}

bool ParamGroup::reshard_after_forward() const {
  return settings_.reshard_after_forward.value_or(nested_ || post_forward_ != nullptr);
}

// --- the lifecycle -------------------------------------------------------------------------------

void ParamGroup::pre_forward() {
  training_ = TrainingState::kForward;
  backward_end_.forward_began();
  wait_for_unshard();
  if (at::GradMode::is_enabled()) arm_grad_hooks();
}

void ParamGroup::post_forward(AfterForward what) {
  training_ = TrainingState::kIdle;
  switch (what) {
    case AfterForward::kKeep:
      return;
    case AfterForward::kFree:
      reshard();
      return;
    case AfterForward::kAsSet:
      if (!reshard_after_forward()) return;
      if (post_forward_) {
        reshard_to_post_forward();
      } else {
        reshard();
      }
      return;
  }
}

bool ParamGroup::pre_backward() {
  if (training_ == TrainingState::kPreBackward || training_ == TrainingState::kPostBackward) {
    return false;
  }
  training_ = TrainingState::kPreBackward;
  wait_for_unshard();
  return true;
}

void ParamGroup::pre_recompute(bool arm_hooks) {
  wait_for_unshard();
  if (arm_hooks) arm_grad_hooks();
}

void ParamGroup::refresh_reduce_layout() {
  // What is trainable is read at each forward (FSDP2 reads it at each backward): freezing or
  // unfreezing after fully_shard changes what the reduce-scatter carries. Not while this
  // group's reduction is in flight (it reads the layout); its post-backward looks again.
  if (reduction_ && !reduction_->finished()) return;
  std::vector<bool> trainable;
  trainable.reserve(params_.size());
  for (const auto& p : params_) trainable.push_back(p.requires_grad());
  if (trainable == trainable_) return;
  trainable_ = std::move(trainable);
  reduce_layout_ = flat_layout(shapes(), pg_->size(), trainable_);
}

void ParamGroup::arm_grad_hooks() {
  backward_end_.hooks_armed(0);
  if (grads_pass_through()) return;
  refresh_reduce_layout();
  size_t expected = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (!p.requires_grad()) continue;
    ++expected;
    auto node = torch::autograd::impl::grad_accumulator(p.param());
    if (!node || p.hooked(node)) continue;
    node->add_pre_hook(std::make_unique<CaptureGradHook>(weak_from_this(), i));
    p.set_hooked(std::move(node));
  }
  backward_end_.hooks_armed(expected);
}

bool ParamGroup::take_param_grad(size_t index, const at::Tensor& grad) {
  // Gradients go to grad() as autograd delivers them: nothing to reduce (a hook armed while a
  // divide factor was set stays on the accumulator and lets them through).
  if (grads_pass_through()) return false;
  if (on_grad_hook_) on_grad_hook_();
  params_[index].capture_full_grad(grad);
  // All gradients present ends this unit's backward only when no parameter is frozen and each
  // use's gradients arrive together (backward_end.h); otherwise the inputs' function or the
  // end of the tree's backward ends it.
  if (backward_end_.param_grad_arrived(index)) post_backward();
  return true;
}

void ParamGroup::input_grad_arrived() {
  // Gradients reached the unit's inputs (every one wrapped since the last backward): nothing
  // in the unit reads its parameters any more, frozen ones included.
  if (backward_end_.input_grad_arrived()) post_backward();
}

void ParamGroup::tree_backward_ended() {
  // Units whose gradients were incomplete (unused or frozen parameters) reduce what they have.
  if (BackwardEnd::tree_backward_ended()) post_backward();
}

void ParamGroup::post_backward() {
  if (training_ == TrainingState::kPostBackward) return;  // at most once per backward
  training_ = TrainingState::kPostBackward;
  FSDP_RANGE(range_names_->post_backward);
  // One rank in its own dtype: autograd already accumulates into the (unsharded) shard.
  if (grads_pass_through()) return;
  const bool reshard_now = settings_.reshard_after_backward;
  bool any_grad = false;
  for (const auto& p : params_) any_grad = any_grad || p.has_full_grad();
  const bool if_unused = settings_.reduce_scatter_unused_params;
  // Never gathered for backward (output unused, eval) and nothing kept: nothing to reduce.
  if (!if_unused && !any_grad && sharded_ != ShardedState::kUnsharded) return;
  if (!settings_.requires_gradient_sync) {
    for (auto& p : params_) p.keep_full_grad(reduce_dtype_);
    if (reshard_now) reshard();
    return;
  }
  // Full gradients are separate tensors: the full parameters are not needed for the reduction.
  if (reshard_now) reshard();
  // A reduction of this group still in flight (one unit, and reductions left in flight by
  // set_is_last_backward(false)) lands first: its gradients and kept shards come first, and
  // the layout follows a trainable set that changed meanwhile (or a gradient of a parameter
  // unfrozen then would be dropped).
  if (reduction_ && !reduction_->finished()) {
    reduction_->finish();
    refresh_reduce_layout();
  }
  // The same on every rank (the graphs are the same): nothing took a gradient.
  if (reduce_layout_.total == 0 || (!any_grad && !if_unused)) return;
  ReduceSpec spec;
  spec.shard = pg_;
  spec.replicate = replicate_;
  spec.dtype = reduce_dtype_;
  spec.divide_factor = settings_.gradient_divide_factor;
  spec.all_reduce = settings_.requires_all_reduce;
  spec.zeros_if_unused = if_unused;
  spec.to_host = offload_;
  spec.pin_host = pin_host_;
  spec.hooks = settings_.hooks;
  reduction_ = foreach_reduce(params_, reduce_layout_, spec, deferred_, comm_, range_names_);
  track_reduction(*comm_, reduction_);
}

void ParamGroup::finalize_backward() {
  for (auto& p : params_) p.release_hooked();
  if (settings_.reshard_after_backward) reshard();
  training_ = TrainingState::kIdle;
  backward_end_.clear();
}

void ParamGroup::reset() {
  for (auto& p : params_) {
    p.drop_full_grad();
    p.release_hooked();
  }
  reshard();
  training_ = TrainingState::kIdle;
  backward_end_.clear();
}

bool ParamGroup::params_in_foreign_graph() const {
  for (const auto& p : params_) {
    // An accumulator alive but not ours: some live graph uses the parameter directly.
    auto node = torch::autograd::impl::try_get_grad_accumulator(p.param());
    if (node && !p.hooked(node)) return true;
  }
  return false;
}

// --- gathering -----------------------------------------------------------------------------------

void ParamGroup::unshard() {
  if (sharded_ == ShardedState::kUnsharded || gather_.work || params_.empty() ||
      params_pass_through()) {
    return;
  }
  FSDP_RANGE(range_names_->all_gather);
  const bool small = sharded_ == ShardedState::kShardedPostForward;
  // Values written into a parameter moved off its shard since the last gather (Module::to after
  // fully_shard) are what the gather must send.
  if (sharded_ == ShardedState::kSharded) {
    for (auto& p : params_) p.adopt_replaced_data();
  }
  ProcessGroup& group = small ? *post_forward_ : *pg_;
  const int64_t per_rank = small ? post_forward_layout_.total : gather_layout_.total;
  auto opts = buffer_options(compute_dtype_);
  Gather g;
  g.small = small;
  try {
    if (small) {
      g.input = post_forward_shard_;  // written after forward, counted since
    } else {
      g.input = comm_->take_buffer(per_rank, opts);  // copy-in writes every element
      FSDP_RANGE("fsdp::all_gather_copy_in");
      // From host memory with offload: asynchronous from pinned shards.
      all_gather_copy_in(params_, gather_layout_, g.input, /*non_blocking=*/offload_);
    }
    g.output = comm_->take_buffer(group.size() * per_rank, opts);
    // The regather over the post-forward group moves the forward's gathered values (a
    // quantized gather's already-rounded ones) unchanged: backward computes with the weights
    // forward used.
    g.work =
        small ? group.all_gather(g.output, g.input)
              : issue_all_gather(settings_.hooks, group, g.output, g.input, gather_layout_.offset);
  } catch (...) {
    // Nothing was issued: the state stays as it was (a kept post-forward shard stays kept),
    // and buffers taken go back, so a caller that catches (an out-of-memory) can retry.
    if (!small) comm_->give_buffer(std::move(g.input));
    comm_->give_buffer(std::move(g.output));
    throw;
  }
  if (small) post_forward_shard_ = at::Tensor();  // the gather owns it now
  gather_ = std::move(g);
}

void ParamGroup::wait_for_unshard() {
  if (params_.empty() || params_pass_through()) {
    sharded_ = ShardedState::kUnsharded;
    return;
  }
  if (sharded_ == ShardedState::kUnsharded) return;
  if (!gather_.work) unshard();
  {
    FSDP_RANGE(range_names_->all_gather_wait);
    gather_.work->wait_timed(comm_->exposed());
  }
  {
    FSDP_RANGE("fsdp::all_gather_copy_out");
    attach_full_tensors();
    if (gather_.small) {
      all_gather_copy_out(params_, post_forward_layout_, gather_.output, post_forward_->size());
    } else {
      all_gather_copy_out(params_, gather_layout_, gather_.output, pg_->size());
    }
  }
  release_gather_buffers();
  sharded_ = ShardedState::kUnsharded;
}

void ParamGroup::release_gather_buffers() {
  gather_.work.reset();
  comm_->give_buffer(std::move(gather_.input));
  comm_->give_buffer(std::move(gather_.output));
  gather_ = Gather{};
}

void ParamGroup::attach_full_tensors() {
  for (auto& p : params_) {
    if (p.full_allocated()) continue;
    // The bytes come from the tensor's own device, whatever the current device is (a rank
    // whose GPU is not the current one).
    c10::DeviceGuard device(p.device());
    p.attach_full(comm_->take_full_bytes(p.full_nbytes(), p.device(), p.full_allocator()));
  }
}

void ParamGroup::release_full_tensors() {
  for (auto& p : params_) {
    if (!p.full_allocated()) continue;
    p.release_full();
    comm_->release_full_bytes(p.full_nbytes());
  }
}

void ParamGroup::reshard() {
  if (gather_.work) {
    // A prefetch nobody consumed: let it land before its buffers go.
    gather_.work->wait();
    release_gather_buffers();
  }
  if (post_forward_shard_.defined()) {
    comm_->give_buffer(std::move(post_forward_shard_));
    post_forward_shard_ = at::Tensor();
  }
  for (auto& p : params_) p.use_shard();
  release_full_tensors();
  sharded_ = ShardedState::kSharded;
}

void ParamGroup::reshard_to_post_forward() {
  if (sharded_ != ShardedState::kUnsharded || params_pass_through() || params_.empty()) {
    reshard();
    return;
  }
  // This rank's rows of the smaller group's sharding, from the full parameters it holds now.
  auto shard = comm_->take_buffer(post_forward_layout_.total, buffer_options(compute_dtype_));
  copy_rows_for_rank(params_, post_forward_layout_, post_forward_->rank(), post_forward_->size(),
                     shard);
  reshard();
  post_forward_shard_ = std::move(shard);
  sharded_ = ShardedState::kShardedPostForward;
}

}  // namespace fsdp::detail
