#include "runtime/param_group.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "fsdp/errors.h"
#include "profile/range.h"

namespace fsdp::detail {
namespace {

// Runs after autograd accumulated a full parameter's gradient: a post hook of its
// AccumulateGrad node (post-accumulate-grad hooks exist only from libtorch 2.1).
class GradReadyHook final : public torch::autograd::FunctionPostHook {
 public:
  GradReadyHook(size_t index, std::function<void(size_t)> on_grad)
      : index_(index), on_grad_(std::move(on_grad)) {}

  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    on_grad_(index_);
    return outputs;
  }

 private:
  size_t index_;
  std::function<void(size_t)> on_grad_;
};

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? static_cast<int64_t>(t.nbytes()) : 0; }

}  // namespace

ParamGroup::ParamGroup(std::vector<std::pair<std::string, at::Tensor>> params, ProcessGroupPtr pg,
                       ProcessGroupPtr replicate, MixedPrecisionPolicy mp)
    : pg_(std::move(pg)), replicate_(std::move(replicate)) {
  at::ScalarType orig = params.empty() ? at::kFloat : params.front().second.scalar_type();
  compute_dtype_ = mp.param_dtype.value_or(orig);
  reduce_dtype_ = mp.reduce_dtype.value_or(compute_dtype_);
  int world = pg_->size();
  for (auto& item : params) params_.emplace_back(item.second, pg_->rank(), world, compute_dtype_);
  gather_layout_ = gather_layout(params_);
  reduce_layout_ = reduce_layout(params_);
  // One rank holding everything in its own dtype: the shard is the full parameter and autograd's
  // gradient is already the reduced one, so no copy and no collective is needed.
  // (With replicas the gradient still has to be averaged across them.)
  passthrough_ = world == 1 && !replicate_ && compute_dtype_ == orig && reduce_dtype_ == orig;
}

void ParamGroup::attach(Accounting* acct) {
  acct_ = acct;
  for (auto& p : params_) p.attach(acct);
}

void ParamGroup::unshard_async() {
  if (state_ != State::kSharded || params_.empty() || passthrough_) return;
  FSDP_RANGE(range_names_.all_gather);
  auto opts = at::TensorOptions().dtype(compute_dtype_).device(pg_->device_type());
  gather_in_ = acct_->pool->take(gather_layout_.total, opts);  // copy-in writes every element
  {
    FSDP_RANGE("fsdp::all_gather_copy_in");
    all_gather_copy_in(params_, gather_layout_, gather_in_);
  }
  gather_out_ = acct_->pool->take(pg_->size() * gather_layout_.total, opts);
  acct_->add_comm(bytes_of(gather_in_) + bytes_of(gather_out_));
  gather_work_ = pg_->all_gather(gather_out_, gather_in_);
  state_ = State::kGathering;
}

void ParamGroup::wait_unshard() {
  if (params_.empty() || passthrough_) {
    state_ = State::kFull;
    return;
  }
  if (state_ == State::kFull) return;
  if (state_ == State::kSharded) unshard_async();
  {
    FSDP_RANGE(range_names_.all_gather_wait);
    ExposedCommTimer timer(*acct_);
    gather_work_->wait();
  }
  {
    FSDP_RANGE("fsdp::all_gather_copy_out");
    all_gather_copy_out(params_, gather_layout_, gather_out_, pg_->size());
  }
  release_gather_buffers();
  state_ = State::kFull;
}

void ParamGroup::release_gather_buffers() {
  gather_work_.reset();
  acct_->add_comm(-(bytes_of(gather_in_) + bytes_of(gather_out_)));
  acct_->pool->give(std::move(gather_in_));
  acct_->pool->give(std::move(gather_out_));
  gather_in_ = gather_out_ = at::Tensor();
}

void ParamGroup::reshard() {
  if (state_ == State::kGathering) {
    // A prefetch nobody consumed: let it land before its buffers go.
    gather_work_->wait();
    release_gather_buffers();
  }
  for (auto& p : params_) p.use_shard();
  state_ = State::kSharded;
}

size_t ParamGroup::arm_grad_hooks(const std::function<void(size_t)>& on_grad) {
  if (passthrough_) return 0;
  size_t expected = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (!p.requires_grad()) continue;
    ++expected;
    auto node = torch::autograd::impl::grad_accumulator(p.param());
    if (!node || p.hooked(node)) continue;
    node->add_post_hook(std::make_unique<GradReadyHook>(i, on_grad));
    p.set_hooked(std::move(node));
  }
  return expected;
}

bool ParamGroup::post_backward(bool reduce) {
  // One rank in its own dtype: autograd already accumulates into the (unsharded) shard.
  if (reduce_layout_.total == 0 || passthrough_) return false;
  // Never gathered for backward (output unused, eval): there are no full gradients.
  if (state_ != State::kFull) return false;
  if (!reduce) {
    for (auto& p : params_) {
      if (p.requires_grad()) p.stash_full_grad(reduce_dtype_);
    }
    reshard();
    return false;
  }
  FSDP_RANGE(range_names_.reduce_scatter);
  int world = pg_->size();
  auto opts = at::TensorOptions().dtype(reduce_dtype_).device(pg_->device_type());
  // Copy-in writes every element: gradient rows, or zeros for padding and missing gradients.
  auto in = acct_->pool->take(world * reduce_layout_.total, opts);
  {
    FSDP_RANGE("fsdp::reduce_scatter_copy_in");
    reduced_had_grad_ = reduce_scatter_copy_in(params_, reduce_layout_, in, world);
  }
  const bool any = std::find(reduced_had_grad_.begin(), reduced_had_grad_.end(), true) !=
                   reduced_had_grad_.end();
  reshard();   // full gradients are gone; full parameters are no longer needed
  if (!any) {  // the same on every rank: the graphs are the same
    acct_->pool->give(std::move(in));
    return false;
  }
  reduce_in_ = in;
  reduce_out_ = acct_->pool->take(reduce_layout_.total, opts);
  acct_->add_comm(bytes_of(reduce_in_) + bytes_of(reduce_out_));
  reduce_work_ = pg_->reduce_scatter(reduce_out_, reduce_in_, ReduceOp::kAvg);
  return true;
}

void ParamGroup::start_all_reduce() {
  if (!reduce_work_ || all_reduce_issued_ || !replicate_) return;
  {
    FSDP_RANGE(range_names_.reduce_scatter_wait);
    ExposedCommTimer timer(*acct_);
    reduce_work_->wait();
  }
  FSDP_RANGE(range_names_.all_reduce);
  // The shard group averaged over its ranks; averaging over the replicas makes it the average
  // over the world. In place on the reduced shard: no further buffer. Replacing the work drops
  // the reduce-scatter's, the backend's last reference to its input.
  reduce_work_ = replicate_->all_reduce(reduce_out_, ReduceOp::kAvg);
  all_reduce_issued_ = true;
  // The reduce-scatter's input (world-sized) is spent: back to the pool now, so that the next
  // unit's reduce-scatter reuses it while this all-reduce runs.
  acct_->add_comm(-bytes_of(reduce_in_));
  acct_->pool->give(std::move(reduce_in_));
  reduce_in_ = at::Tensor();
}

void ParamGroup::finish_reduce() {
  if (reduce_work_) {
    start_all_reduce();
    {
      FSDP_RANGE(all_reduce_issued_ ? range_names_.all_reduce_wait
                                    : range_names_.reduce_scatter_wait);
      ExposedCommTimer timer(*acct_);
      reduce_work_->wait();
    }
    {
      FSDP_RANGE("fsdp::reduce_scatter_copy_out");
      reduce_scatter_copy_out(params_, reduce_layout_, reduce_out_, reduced_had_grad_);
    }
    reduce_work_.reset();  // the backend's last reference to the buffers
    all_reduce_issued_ = false;
    acct_->add_comm(-(bytes_of(reduce_in_) + bytes_of(reduce_out_)));
    acct_->pool->give(std::move(reduce_in_));
    acct_->pool->give(std::move(reduce_out_));
    reduce_in_ = reduce_out_ = at::Tensor();
  }
}

void ParamGroup::end_backward() {
  for (auto& p : params_) p.release_hooked();
}

}  // namespace fsdp::detail
