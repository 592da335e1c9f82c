#include "runtime/fsdp_param.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>

namespace fsdp::detail {
namespace {

// A shard's bytes: the allocation it was made with, and the unit it belongs to. Its deleter is
// the mark is_fsdp_shard reads.
struct ShardBytes {
  at::DataPtr allocation;
  std::string owner;
};

void delete_shard_bytes(void* ctx) { delete static_cast<ShardBytes*>(ctx); }

// Re-wraps `t`'s storage bytes in a DataPtr that marks them as a shard of `owner`.
void mark_as_shard(const at::Tensor& t, const std::string& owner) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const auto device = storage->device();
  at::DataPtr allocation = storage->set_data_ptr(at::DataPtr(nullptr, device));
  void* data = allocation.get();
  auto* bytes = new ShardBytes{std::move(allocation), owner};
  storage->set_data_ptr_noswap(at::DataPtr(data, bytes, &delete_shard_bytes, device));
}

}  // namespace

bool is_fsdp_shard(const at::Tensor& t, std::string* owner) {
  if (!t.defined() || !t.has_storage()) return false;
  const at::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get_deleter() != &delete_shard_bytes) return false;
  if (owner) *owner = static_cast<const ShardBytes*>(ptr.get_context())->owner;
  return true;
}

FsdpParam::FsdpParam(at::Tensor param, int rank, int world, at::ScalarType compute_dtype,
                     const std::string& owner)
    : param_(std::move(param)) {
  at::NoGradGuard no_grad;
  full_shape_ = param_.sizes().vec();
  row_numel_ = 1;
  for (size_t i = 1; i < full_shape_.size(); ++i) row_numel_ *= full_shape_[i];
  for (int r = 0; r < world; ++r) ranges_.push_back(shard_range(full_shape_[0], world, r));
  const ShardRange& mine = ranges_[rank];
  shard_ = param_.detach().narrow(0, mine.begin, mine.rows()).clone().contiguous();
  mark_as_shard(shard_, owner);
  full_ = at::empty(full_shape_, param_.options().dtype(compute_dtype));
  full_nbytes_ = static_cast<int64_t>(full_.nbytes());
  // The full tensor starts without bytes; gathers allocate them.
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  // A gradient already there is a full one: sharded like the parameter, it stays the user's.
  at::Tensor grad = param_.grad();
  param_.set_data(shard_);
  if (grad.defined()) {
    param_.mutable_grad() = grad.narrow(0, mine.begin, mine.rows()).clone().contiguous();
  }
}

void FsdpParam::allocate_full(Accounting& acct) {
  if (full_allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  // The bytes come from the tensor's own device, whatever the current device is (a rank
  // whose GPU is not the current one).
  c10::DeviceGuard device(full_.device());
  storage->set_data_ptr(acct.pool->take_bytes(full_nbytes_, full_.device(), storage->allocator()));
  storage->set_nbytes(full_nbytes_);
  full_allocated_ = true;
  acct.add_full(full_nbytes_);
}

const at::Tensor& FsdpParam::allocate_full_tensor(Accounting& acct) {
  allocate_full(acct);
  return full_;
}

void FsdpParam::release_full(Accounting& acct) {
  if (!full_allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  // Dropping the DataPtr frees the bytes (to the pool); views autograd saved keep the (now
  // empty) storage.
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  full_allocated_ = false;
  acct.add_full(-full_nbytes_);
}

void FsdpParam::copy_shard_to(const at::Tensor& dst) const {
  const int64_t n = shard_.numel();
  if (n > 0) dst.narrow(0, 0, n).copy_(shard_.view(-1));
  // Padding is sent too: zero exactly that tail rather than the whole buffer.
  if (n < dst.numel()) dst.narrow(0, n, dst.numel() - n).zero_();
}

void FsdpParam::copy_full_from(const at::Tensor& gathered, int world, Accounting& acct) {
  allocate_full(acct);
  at::NoGradGuard no_grad;
  auto full_rows = full_.view({full_shape_[0], row_numel_});
  for (int r = 0; r < world; ++r) {
    const ShardRange rows =
        world == this->world() ? ranges_[r] : shard_range(full_shape_[0], world, r);
    if (rows.rows() == 0) continue;
    full_rows.narrow(0, rows.begin, rows.rows())
        .copy_(gathered[r].narrow(0, 0, rows.rows() * row_numel_).view({rows.rows(), row_numel_}));
  }
}

void FsdpParam::use_full() {
  if (holds_full_) return;
  param_.set_data(full_);
  holds_full_ = true;
}

void FsdpParam::use_shard(Accounting& acct) {
  if (holds_full_) {
    param_.set_data(shard_);
    holds_full_ = false;
  }
  release_full(acct);
}

void FsdpParam::capture_full_grad(const at::Tensor& grad) {
  if (!grad.defined()) return;
  at::NoGradGuard no_grad;
  if (!full_grad_.defined()) {
    // Autograd's tensor as it is (no copy); autograd may share it, so it is never changed in
    // place: a second gradient makes a tensor of our own.
    full_grad_ = grad;
    owns_full_grad_ = false;
  } else if (!owns_full_grad_) {
    full_grad_ = full_grad_.add(grad);
    owns_full_grad_ = true;
  } else {
    full_grad_.add_(grad);
  }
}

void FsdpParam::keep_full_grad(at::ScalarType dtype) {
  if (!full_grad_.defined()) return;
  at::NoGradGuard no_grad;
  if (kept_grad_.defined()) {
    kept_grad_.add_(full_grad_);
  } else {
    // A tensor of our own in the reduce dtype (a copy unless autograd's was one already).
    kept_grad_ = owns_full_grad_ ? full_grad_.to(dtype) : full_grad_.to(dtype, false, true);
  }
  full_grad_ = at::Tensor();
}

at::Tensor FsdpParam::take_full_grad() {
  at::NoGradGuard no_grad;
  at::Tensor grad;
  if (kept_grad_.defined()) {
    // Sync is back on: this backward's gradient joins the ones kept since the last reduction.
    grad = std::move(kept_grad_);
    kept_grad_ = at::Tensor();
    if (full_grad_.defined()) grad.add_(full_grad_);
  } else {
    grad = full_grad_;
  }
  full_grad_ = at::Tensor();
  return grad;
}

bool FsdpParam::take_full_grad_into(const at::Tensor& dst) {
  at::NoGradGuard no_grad;
  at::Tensor grad = take_full_grad();
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
  at::Tensor& slot = param_.mutable_grad();
  if (slot.defined()) {
    slot.add_(g);
  } else {
    // Always a fresh tensor: `reduced` views a communication buffer about to be freed, and
    // optimizers detach_() grads, which views do not allow.
    slot = g.to(orig_dtype(), /*non_blocking=*/false, /*copy=*/true);
  }
}

int64_t FsdpParam::sharded_grad_bytes() const {
  const at::Tensor& g = param_.grad();
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
