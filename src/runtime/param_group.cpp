#include "runtime/param_group.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "runtime/collectives.h"
#include "util/check.h"

namespace fsdp::detail {
namespace {

// Runs before autograd's accumulator of a full parameter: hands the gradient to FSDP and the
// accumulator nothing (an undefined gradient, which AccumulateGrad skips), so grad() keeps the
// sharded gradient (fsdp_param.h).
class CaptureGradHook final : public torch::autograd::FunctionPreHook {
 public:
  CaptureGradHook(size_t index, std::function<void(size_t, const at::Tensor&)> on_grad)
      : index_(index), on_grad_(std::move(on_grad)) {}

  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    if (!grads.empty() && grads[0].defined()) on_grad_(index_, grads[0]);
    return {at::Tensor()};
  }

 private:
  size_t index_;
  std::function<void(size_t, const at::Tensor&)> on_grad_;
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

ParamGroup::ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params,
                       const DeviceMesh& mesh, MixedPrecisionPolicy mp,
                       ProcessGroupPtr post_forward, const std::string& owner)
    : pg_(mesh.shard), replicate_(mesh.replicate), post_forward_(std::move(post_forward)) {
  at::ScalarType orig = params.empty() ? at::kFloat : params.front().second.scalar_type();
  compute_dtype_ = mp.param_dtype.value_or(orig);
  reduce_dtype_ = mp.reduce_dtype.value_or(compute_dtype_);
  int world = pg_->size();
  for (auto& item : params) {
    params_.emplace_back(item.second, pg_->rank(), world, compute_dtype_, owner);
  }
  gather_layout_ = flat_layout(shapes(), world);
  for (const auto& p : params_) trainable_.push_back(p.requires_grad());
  reduce_layout_ = flat_layout(shapes(), world, trainable_);
  if (post_forward_) {
    post_forward_shapes_ = shapes();
    post_forward_layout_ = flat_layout(post_forward_shapes_, post_forward_->size());
  }
  // One rank holding everything in its own dtype: the shard is the full parameter and autograd's
  // gradient is already the reduced one, so no copy and no collective is needed.
  // (With replicas the gradient still has to be averaged across them.)
  passthrough_ = world == 1 && !replicate_ && compute_dtype_ == orig && reduce_dtype_ == orig;
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

void ParamGroup::unshard_async(Accounting& acct) {
  if (state_ != State::kSharded || params_.empty() || passthrough_) return;
  FSDP_RANGE(range_names_.all_gather);
  const bool small = post_forward_shard_.defined();
  ProcessGroup& group = small ? *post_forward_ : *pg_;
  const int64_t per_rank = small ? post_forward_layout_.total : gather_layout_.total;
  auto opts = buffer_options(compute_dtype_);
  if (small) {
    gather_in_ = std::move(post_forward_shard_);  // written after forward
    post_forward_shard_ = at::Tensor();
  } else {
    gather_in_ = acct.pool->take(per_rank, opts);  // copy-in writes every element
    FSDP_RANGE("fsdp::all_gather_copy_in");
    all_gather_copy_in(params_, gather_layout_, gather_in_);
  }
  gather_out_ = acct.pool->take(group.size() * per_rank, opts);
  acct.add_comm(bytes_of(gather_out_) + (small ? 0 : bytes_of(gather_in_)));
  gather_work_ = group.all_gather(gather_out_, gather_in_);
  gathering_small_ = small;
  state_ = State::kGathering;
}

void ParamGroup::wait_unshard(Accounting& acct) {
  if (params_.empty() || passthrough_) {
    state_ = State::kFull;
    return;
  }
  if (state_ == State::kFull) return;
  if (state_ == State::kSharded) unshard_async(acct);
  {
    FSDP_RANGE(range_names_.all_gather_wait);
    gather_work_->wait_timed(acct.exposed_comm_seconds);
  }
  {
    FSDP_RANGE("fsdp::all_gather_copy_out");
    if (gathering_small_) {
      all_gather_copy_out(params_, post_forward_layout_, gather_out_, *post_forward_, acct);
    } else {
      all_gather_copy_out(params_, gather_layout_, gather_out_, *pg_, acct);
    }
  }
  release_gather_buffers(acct);
  state_ = State::kFull;
}

void ParamGroup::release_gather_buffers(Accounting& acct) {
  gather_work_.reset();
  acct.add_comm(-(bytes_of(gather_in_) + bytes_of(gather_out_)));
  acct.pool->give(std::move(gather_in_));
  acct.pool->give(std::move(gather_out_));
  gather_in_ = gather_out_ = at::Tensor();
}

void ParamGroup::reshard(Accounting& acct) {
  if (state_ == State::kGathering) {
    // A prefetch nobody consumed: let it land before its buffers go.
    gather_work_->wait();
    release_gather_buffers(acct);
  }
  if (post_forward_shard_.defined()) {
    acct.add_comm(-bytes_of(post_forward_shard_));
    acct.pool->give(std::move(post_forward_shard_));
    post_forward_shard_ = at::Tensor();
  }
  for (auto& p : params_) p.use_shard(acct);
  state_ = State::kSharded;
}

void ParamGroup::reshard_to_post_forward(Accounting& acct) {
  if (!post_forward_ || state_ != State::kFull || passthrough_ || params_.empty()) {
    reshard(acct);
    return;
  }
  // This rank's rows of the smaller group's sharding, from the full parameters it holds now.
  auto shard = acct.pool->take(post_forward_layout_.total, buffer_options(compute_dtype_));
  copy_rows_for_rank(params_, post_forward_layout_, post_forward_->rank(), post_forward_->size(),
                     shard);
  reshard(acct);
  post_forward_shard_ = std::move(shard);
  acct.add_comm(bytes_of(post_forward_shard_));
}

size_t ParamGroup::arm_grad_hooks(const std::function<void(size_t, const at::Tensor&)>& on_grad) {
  if (passthrough_) return 0;
  // What is trainable is read at each forward (FSDP2 reads it at each backward): freezing or
  // unfreezing after fully_shard changes what the reduce-scatter carries.
  std::vector<bool> trainable;
  for (const auto& p : params_) trainable.push_back(p.requires_grad());
  if (trainable != trainable_ && !reduction_in_flight()) {
    trainable_ = std::move(trainable);
    reduce_layout_ = flat_layout(shapes(), pg_->size(), trainable_);
  }
  size_t expected = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (!p.requires_grad()) continue;
    ++expected;
    auto node = torch::autograd::impl::grad_accumulator(p.param());
    if (!node || p.hooked(node)) continue;
    node->add_pre_hook(std::make_unique<CaptureGradHook>(i, on_grad));
    p.set_hooked(std::move(node));
  }
  return expected;
}

bool ParamGroup::post_backward(Accounting& acct, const ReduceSettings& settings, bool reshard_now) {
  // One rank in its own dtype: autograd already accumulates into the (unsharded) shard.
  if (passthrough_) return false;
  bool any_grad = false;
  for (const auto& p : params_) any_grad = any_grad || p.has_full_grad();
  // Never gathered for backward (output unused, eval) and nothing kept: nothing to reduce.
  if (!settings.if_unused && !any_grad && state_ != State::kFull) return false;
  if (!settings.reduce) {
    for (auto& p : params_) p.keep_full_grad(reduce_dtype_);
    if (reshard_now) reshard(acct);
    return false;
  }
  if (reduce_layout_.total == 0 || (!any_grad && !settings.if_unused)) {
    // The same on every rank (the graphs are the same): nothing took a gradient.
    if (reshard_now) reshard(acct);
    return false;
  }
  FSDP_RANGE(range_names_.reduce_scatter);
  int world = pg_->size();
  auto opts = buffer_options(reduce_dtype_);
  // Copy-in writes every element: gradient rows, or zeros for padding and missing gradients.
  auto in = acct.pool->take(world * reduce_layout_.total, opts);
  {
    FSDP_RANGE("fsdp::reduce_scatter_copy_in");
    reduced_had_grad_ = reduce_scatter_copy_in(params_, reduce_layout_, in, world);
  }
  if (settings.if_unused) {
    // Ranks may differ in which parameters got a gradient: the reduced rows land in every
    // trainable parameter, as FSDP2 gives the unused ones zero gradients before reducing.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (reduce_layout_.offset[i] >= 0) reduced_had_grad_[i] = true;
    }
  }
  if (reshard_now) reshard(acct);  // full gradients are gone; full parameters are not needed
  reduce_in_ = in;
  reduce_out_ = acct.pool->take(reduce_layout_.total, opts);
  acct.add_comm(bytes_of(reduce_in_) + bytes_of(reduce_out_));
  all_reduce_wanted_ = settings.all_reduce;
  divide_factor_ = settings.divide_factor;
  // A custom factor divides the sum once at the end; the default averages at each level (the
  // engines' own average, as FSDP2 does).
  reduce_work_ = pg_->reduce_scatter(reduce_out_, reduce_in_,
                                     divide_factor_ > 0 ? ReduceOp::kSum : ReduceOp::kAvg);
  return true;
}

void ParamGroup::start_all_reduce(Accounting& acct) {
  if (!reduce_work_ || all_reduce_issued_ || !replicate_) return;
  {
    FSDP_RANGE(range_names_.reduce_scatter_wait);
    reduce_work_->wait_timed(acct.exposed_comm_seconds);
  }
  // The reduce-scatter's input (world-sized) is spent: back to the pool now, so that the next
  // unit's reduce-scatter reuses it while this all-reduce runs. Resetting the work drops the
  // backend's last reference to it.
  reduce_work_.reset();
  acct.add_comm(-bytes_of(reduce_in_));
  acct.pool->give(std::move(reduce_in_));
  reduce_in_ = at::Tensor();
  if (pending_reduced_.defined()) {
    // Shards kept by backwards without the all-reduce join this one.
    FSDP_CHECK_ARG(pending_reduced_.numel() == reduce_out_.numel(),
                   "fsdp: the trainable parameters of a unit changed while reduced gradients "
                   "waited for their all-reduce (set_requires_all_reduce(false)); change "
                   "requires_grad only after a backward with the all-reduce on");
    reduce_out_.add_(pending_reduced_);
    pending_reduced_ = at::Tensor();
    for (size_t i = 0; i < reduced_had_grad_.size() && i < pending_had_grad_.size(); ++i) {
      reduced_had_grad_[i] = reduced_had_grad_[i] || pending_had_grad_[i];
    }
    pending_had_grad_.clear();
  }
  if (!all_reduce_wanted_) return;
  FSDP_RANGE(range_names_.all_reduce);
  // The shard group averaged over its ranks; averaging over the replicas makes it the average
  // over the world. In place on the reduced shard: no further buffer.
  reduce_work_ =
      replicate_->all_reduce(reduce_out_, divide_factor_ > 0 ? ReduceOp::kSum : ReduceOp::kAvg);
  all_reduce_issued_ = true;
}

void ParamGroup::finish_reduce(Accounting& acct) {
  if (!reduce_out_.defined()) return;  // nothing reduced since the last finish
  start_all_reduce(acct);
  if (reduce_work_) {  // the all-reduce (hybrid) or the reduce-scatter
    FSDP_RANGE(all_reduce_issued_ ? range_names_.all_reduce_wait
                                  : range_names_.reduce_scatter_wait);
    reduce_work_->wait_timed(acct.exposed_comm_seconds);
  }
  reduce_work_.reset();  // the backend's last reference to the buffers
  const bool kept = replicate_ && !all_reduce_wanted_;
  if (kept) {
    // Hybrid accumulation without the all-reduce: the reduced shard waits for the next one.
    if (pending_reduced_.defined()) {
      pending_reduced_.add_(reduce_out_);
    } else {
      pending_reduced_ = reduce_out_.clone();
    }
    pending_had_grad_.resize(reduced_had_grad_.size(), false);
    for (size_t i = 0; i < reduced_had_grad_.size(); ++i) {
      pending_had_grad_[i] = pending_had_grad_[i] || reduced_had_grad_[i];
    }
  } else {
    if (divide_factor_ > 0) reduce_out_.div_(divide_factor_);
    FSDP_RANGE("fsdp::reduce_scatter_copy_out");
    reduce_scatter_copy_out(params_, reduce_layout_, reduce_out_, reduced_had_grad_);
  }
  all_reduce_issued_ = false;
  acct.add_comm(-(bytes_of(reduce_in_) + bytes_of(reduce_out_)));
  acct.pool->give(std::move(reduce_in_));
  acct.pool->give(std::move(reduce_out_));
  reduce_in_ = reduce_out_ = at::Tensor();
}

void ParamGroup::end_backward() {
  for (auto& p : params_) p.release_hooked();
}

void ParamGroup::drop_backward() {
  for (auto& p : params_) {
    p.drop_full_grad();
    p.release_hooked();
  }
}

}  // namespace fsdp::detail
