#include "runtime/fsdp_param.h"

#include <torch/csrc/autograd/function.h>

namespace fsdp::detail {

FsdpParam::FsdpParam(at::Tensor param, int rank, int world, at::ScalarType compute_dtype)
    : param_(std::move(param)) {
  at::NoGradGuard no_grad;
  full_shape_ = param_.sizes().vec();
  row_numel_ = 1;
  for (size_t i = 1; i < full_shape_.size(); ++i) row_numel_ *= full_shape_[i];
  for (int r = 0; r < world; ++r) ranges_.push_back(shard_range(full_shape_[0], world, r));
  const ShardRange& mine = ranges_[rank];
  shard_ = param_.detach().narrow(0, mine.begin, mine.rows()).clone().contiguous();
  full_ = at::empty(full_shape_, param_.options().dtype(compute_dtype));
  full_nbytes_ = static_cast<int64_t>(full_.nbytes());
  // The full tensor starts without bytes; gathers allocate them.
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  param_.set_data(shard_);
}

void FsdpParam::allocate_full() {
  if (full_allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(
      acct_->pool->take_bytes(full_nbytes_, full_.device(), storage->allocator()));
  storage->set_nbytes(full_nbytes_);
  full_allocated_ = true;
  acct_->add_full(full_nbytes_);
}

void FsdpParam::release_full() {
  if (!full_allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  // Dropping the DataPtr frees the bytes (to the pool); views autograd saved keep the (now
  // empty) storage.
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  full_allocated_ = false;
  acct_->add_full(-full_nbytes_);
}

void FsdpParam::copy_shard_to(const at::Tensor& dst) const {
  const int64_t n = shard_.numel();
  if (n > 0) dst.narrow(0, 0, n).copy_(shard_.view(-1));
  // Padding is sent too: zero exactly that tail rather than the whole buffer.
  if (n < dst.numel()) dst.narrow(0, n, dst.numel() - n).zero_();
}

void FsdpParam::copy_full_from(const at::Tensor& gathered) {
  allocate_full();
  at::NoGradGuard no_grad;
  auto full_rows = full_.view({full_shape_[0], row_numel_});
  for (size_t r = 0; r < ranges_.size(); ++r) {
    int64_t rows = ranges_[r].rows();
    if (rows == 0) continue;
    full_rows.narrow(0, ranges_[r].begin, rows)
        .copy_(gathered[r].narrow(0, 0, rows * row_numel_).view({rows, row_numel_}));
  }
}

void FsdpParam::use_full() {
  if (holds_full_) return;
  grad_stash_ = param_.grad();
  param_.mutable_grad() = at::Tensor();
  param_.set_data(full_);
  holds_full_ = true;
}

void FsdpParam::use_shard() {
  if (holds_full_) {
    param_.set_data(shard_);
    param_.mutable_grad() = grad_stash_;
    grad_stash_ = at::Tensor();
    holds_full_ = false;
  }
  release_full();
}

void FsdpParam::stash_full_grad(at::ScalarType dtype) {
  at::Tensor grad = holds_full_ ? param_.grad() : at::Tensor();
  if (!grad.defined()) return;
  at::NoGradGuard no_grad;
  param_.mutable_grad() = at::Tensor();
  if (unsharded_grad_.defined()) {
    unsharded_grad_.add_(grad);
  } else {
    // Same dtype: keep autograd's tensor as it is (no copy); else a converted copy.
    unsharded_grad_ = grad.to(dtype);
  }
}

bool FsdpParam::take_full_grad_into(const at::Tensor& dst) {
  at::Tensor grad = holds_full_ ? param_.grad() : at::Tensor();
  at::NoGradGuard no_grad;
  if (grad.defined()) param_.mutable_grad() = at::Tensor();
  if (unsharded_grad_.defined()) {
    // Sync is back on: this backward's gradient joins the ones kept since the last reduction.
    if (grad.defined()) unsharded_grad_.add_(grad);
    grad = std::move(unsharded_grad_);
    unsharded_grad_ = at::Tensor();
  }
  if (!grad.defined()) {
    dst.zero_();  // contributes nothing to the reduction
    return false;
  }
  auto grad_rows = grad.reshape({full_shape_[0], row_numel_});
  const int64_t padded = padded_numel();
  for (size_t r = 0; r < ranges_.size(); ++r) {
    const int64_t n = ranges_[r].rows() * row_numel_;
    if (n > 0) {
      dst[r]
          .narrow(0, 0, n)
          .view({ranges_[r].rows(), row_numel_})
          .copy_(grad_rows.narrow(0, ranges_[r].begin, ranges_[r].rows()));
    }
    if (n < padded) dst[r].narrow(0, n, padded - n).zero_();  // padding rows
  }
  return true;
}

void FsdpParam::accumulate_shard_grad(const at::Tensor& reduced) {
  at::NoGradGuard no_grad;
  auto g = reduced.narrow(0, 0, shard_.numel()).view(shard_.sizes());
  at::Tensor& slot = holds_full_ ? grad_stash_ : param_.mutable_grad();
  if (slot.defined()) {
    slot.add_(g);
  } else {
    // Always a fresh tensor: `reduced` views a communication buffer about to be freed, and
    // optimizers detach_() grads, which views do not allow.
    slot = g.to(orig_dtype(), /*non_blocking=*/false, /*copy=*/true);
  }
}

int64_t FsdpParam::sharded_grad_bytes() const {
  const at::Tensor& g = holds_full_ ? grad_stash_ : param_.grad();
  return g.defined() ? static_cast<int64_t>(g.nbytes()) : 0;
}

bool FsdpParam::hooked(const std::shared_ptr<torch::autograd::Node>& node) const {
  auto current = hooked_.lock();
  return current && current.get() == node.get();
}

void FsdpParam::set_hooked(std::shared_ptr<torch::autograd::Node> node) {
  hooked_ = node;
  hooked_strong_ = std::move(node);
}

}  // namespace fsdp::detail
