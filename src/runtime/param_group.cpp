#include "runtime/param_group.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "fsdp/errors.h"

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
                       MixedPrecisionPolicy mp)
    : pg_(std::move(pg)), mp_(mp) {
  at::ScalarType orig = params.empty() ? at::kFloat : params.front().second.scalar_type();
  compute_dtype_ = mp_.param_dtype.value_or(orig);
  reduce_dtype_ = mp_.reduce_dtype.value_or(compute_dtype_);
  int world = pg_->size();
  for (auto& [name, p] : params) {
    const int64_t dim0 = p.size(0);  // read before FsdpParam points p at its shard
    params_.emplace_back(name, p, pg_->rank(), world, compute_dtype_);
    auto& fp = params_.back();
    gather_offset_.push_back(padded_total_);
    padded_total_ += fp.padded_numel();
    reduce_offset_.push_back(fp.requires_grad() ? reduce_total_ : -1);
    if (fp.requires_grad()) reduce_total_ += fp.padded_numel();
    std::vector<ShardRange> ranges;
    for (int r = 0; r < world; ++r) ranges.push_back(shard_range(dim0, world, r));
    ranges_.push_back(std::move(ranges));
  }
  grad_ready_.assign(params_.size(), false);
  // One rank holding everything in its own dtype: the shard is the full parameter and autograd's
  // gradient is already the reduced one, so no copy and no collective is needed.
  passthrough_ = world == 1 && compute_dtype_ == orig && reduce_dtype_ == orig;
}

void ParamGroup::unshard_async(Accounting& acct) {
  if (state_ != State::kSharded || params_.empty() || passthrough_) return;
  auto opts = at::TensorOptions().dtype(compute_dtype_).device(pg_->device_type());
  gather_in_ = acct.pool->take(padded_total_, opts);  // every element written below
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].copy_shard_to(gather_in_.narrow(0, gather_offset_[i], params_[i].padded_numel()));
  }
  gather_out_ = acct.pool->take(pg_->size() * padded_total_, opts);
  acct.add_comm(bytes_of(gather_in_) + bytes_of(gather_out_));
  gather_work_ = pg_->all_gather(gather_out_, gather_in_);
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
    ExposedCommTimer timer(acct);
    gather_work_->wait();
  }
  auto per_rank = gather_out_.view({pg_->size(), padded_total_});
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].copy_full_from(per_rank.narrow(1, gather_offset_[i], params_[i].padded_numel()),
                              ranges_[i], acct);
    params_[i].use_full();
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
  for (auto& p : params_) p.use_shard(acct);
  state_ = State::kSharded;
}

void ParamGroup::arm_grad_hooks(const std::function<void(size_t)>& on_grad) {
  grads_expected_ = 0;
  if (passthrough_) return;
  for (size_t i = 0; i < params_.size(); ++i) {
    auto& p = params_[i];
    if (!p.requires_grad()) continue;
    ++grads_expected_;
    auto node = torch::autograd::impl::grad_accumulator(p.param());
    if (!node || p.hooked(node)) continue;
    node->add_post_hook(std::make_unique<GradReadyHook>(i, on_grad));
    p.set_hooked(std::move(node));
  }
}

bool ParamGroup::on_grad_ready(size_t index) {
  if (index >= grad_ready_.size() || grad_ready_[index]) return false;
  grad_ready_[index] = true;
  // All gradients present is the end of this unit's backward only when every parameter takes
  // a gradient: a frozen weight may still be read to compute input gradients after that (the
  // post-backward function on the unit's inputs covers that case).
  return ++grads_seen_ == grads_expected_ && grads_expected_ == params_.size();
}

bool ParamGroup::post_backward(Accounting& acct) {
  if (reduced_this_backward_ || reduce_total_ == 0 || passthrough_) return false;
  if (state_ != State::kFull) {
    // Never gathered for backward (output unused, eval): there are no full gradients.
    reduced_this_backward_ = true;
    return false;
  }
  int world = pg_->size();
  auto opts = at::TensorOptions().dtype(reduce_dtype_).device(pg_->device_type());
  // Every element is written below: gradient rows, or zeros for padding and missing gradients.
  auto in = acct.pool->take(world * reduce_total_, opts);
  auto per_rank = in.view({world, reduce_total_});
  reduced_has_grad_.assign(params_.size(), false);
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (reduce_offset_[i] < 0) continue;
    auto dst = per_rank.narrow(1, reduce_offset_[i], params_[i].padded_numel());
    reduced_has_grad_[i] = params_[i].take_full_grad_into(dst, ranges_[i]);
    any |= reduced_has_grad_[i];
  }
  reduced_this_backward_ = true;
  reshard(acct);  // full gradients are gone; full parameters are no longer needed
  if (!any) {     // the same on every rank: the graphs are the same
    acct.pool->give(std::move(in));
    return false;
  }
  reduce_in_ = in;
  reduce_out_ = acct.pool->take(reduce_total_, opts);
  acct.add_comm(bytes_of(reduce_in_) + bytes_of(reduce_out_));
  reduce_work_ = pg_->reduce_scatter(reduce_out_, reduce_in_, ReduceOp::kAvg);
  return true;
}

void ParamGroup::finish_reduce(Accounting& acct) {
  if (reduce_work_) {
    {
      ExposedCommTimer timer(acct);
      reduce_work_->wait();
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!reduced_has_grad_[i]) continue;
      params_[i].accumulate_shard_grad(
          reduce_out_.narrow(0, reduce_offset_[i], params_[i].padded_numel()));
    }
    reduce_work_.reset();  // the backend's last reference to the buffers
    acct.add_comm(-(bytes_of(reduce_in_) + bytes_of(reduce_out_)));
    acct.pool->give(std::move(reduce_in_));
    acct.pool->give(std::move(reduce_out_));
    reduce_in_ = reduce_out_ = at::Tensor();
  }
}

void ParamGroup::end_backward() {
  grad_ready_.assign(params_.size(), false);
  grads_seen_ = 0;
  reduced_this_backward_ = false;
  for (auto& p : params_) p.release_hooked();
}

}  // namespace fsdp::detail
