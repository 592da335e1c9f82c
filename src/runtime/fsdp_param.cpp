#include "runtime/fsdp_param.h"

#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/function.h>

#include "util/check.h"

namespace fsdp::detail {

struct FullBytes {
  at::DataPtr inner;  // the attached bytes
  const ShardMark* mark = nullptr;
};

namespace {

// A shard's bytes: the allocation it was made with, and its mark. Its deleter is what
// shard_mark recognises.
struct ShardBytes {
  at::DataPtr allocation;
  ShardMark mark;
};

void delete_shard_bytes(void* ctx) { delete static_cast<ShardBytes*>(ctx); }

// The full tensor's DataPtr deleter: drops the attached bytes (back to their pool), not the
// FullBytes, which its FsdpParam owns for its life.
void release_full_bytes(void* ctx) { static_cast<FullBytes*>(ctx)->inner.clear(); }

// Re-wraps `t`'s storage bytes in a DataPtr that carries `mark`.
void mark_as_shard(const at::Tensor& t, ShardMark mark) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  const auto device = storage->device();
  at::DataPtr allocation = storage->set_data_ptr(at::DataPtr(nullptr, device));
  void* data = allocation.get();
  auto* bytes = new ShardBytes{std::move(allocation), std::move(mark)};
  storage->set_data_ptr_noswap(at::DataPtr(data, bytes, &delete_shard_bytes, device));
}

}  // namespace

const ShardMark* shard_mark(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const at::DataPtr& ptr = t.storage().data_ptr();
  if (ptr.get_deleter() == &delete_shard_bytes) {
    return &static_cast<const ShardBytes*>(ptr.get_context())->mark;
  }
  if (ptr.get_deleter() == &release_full_bytes) {
    return static_cast<const FullBytes*>(ptr.get_context())->mark;
  }
  return nullptr;
}

FsdpParam::FsdpParam(at::Tensor param, const ProcessGroupPtr& shard,
                     const ProcessGroupPtr& replicate, at::ScalarType compute_dtype,
                     const std::string& owner, const std::optional<CPUOffloadPolicy>& offload,
                     int shard_dim)
    : param_(std::move(param)),
      shard_group_(shard),
      replicate_group_(replicate),
      shard_dim_(shard_dim) {
  at::NoGradGuard no_grad;
  const int world = shard->size();
  full_shape_ = param_.sizes().vec();
  row_numel_ = 1;
  for (size_t i = 0; i < full_shape_.size(); ++i) {
    if (static_cast<int>(i) != shard_dim_) row_numel_ *= full_shape_[i];
  }
  for (int r = 0; r < world; ++r) ranges_.push_back(shard_range(full_shape_[shard_dim_], world, r));
  const ShardRange& mine = ranges_[shard->rank()];
  // Shard(d > 0): a contiguous copy of the chunk (below), as FSDP2 keeps it.
  const auto rows = param_.detach().narrow(shard_dim_, mine.begin, mine.rows());
  if (offload) {
    // In host memory, pinned when a GPU will read it (the copies to the device are then
    // asynchronous); a fresh tensor even when the parameter is on the CPU already.
    const bool pin = offload->pin_memory && shard->device().is_cuda();
    shard_ = at::empty(rows.sizes(), rows.options().device(at::kCPU).pinned_memory(pin));
    shard_.copy_(rows);
  } else {
    shard_ = rows.clone().contiguous();
  }
  mark_as_shard(shard_, ShardMark{owner, full_shape_, mine.begin, shard, replicate,
                                  replicate ? replicate->rank() : 0, shard_dim_});
  // The full tensor lives where the unit computes: the parameter's device, or with offload the
  // group's (the parameter may start on the CPU).
  const c10::Device compute_device = offload ? shard->device() : param_.device();
  full_ = at::empty(full_shape_, param_.options().dtype(compute_dtype).device(compute_device));
  full_nbytes_ = static_cast<int64_t>(full_.nbytes());
  full_bytes_ = std::make_unique<FullBytes>();
  full_bytes_->mark = shard_mark(shard_);
  // The full tensor starts without bytes; gathers attach them.
  auto* storage = full_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  // A gradient already there is a full one: sharded like the parameter, it stays the user's.
  at::Tensor grad = param_.grad();
  param_.set_data(shard_);
  if (grad.defined()) {
    param_.mutable_grad() = grad.narrow(shard_dim_, mine.begin, mine.rows())
                                .to(shard_.device(), /*non_blocking=*/false,
                                    /*copy=*/true);
  }
}

ShardedTensor FsdpParam::view() const {
  ShardedTensor v;
  v.local = param_;
  v.global_shape = full_shape_;
  // Shard(d > 0) holds every row: its chunk's place is the shard group's rank.
  v.row_offset = shard_dim_ == 0 ? ranges_[shard_group_->rank()].begin : 0;
  v.shard_dim = shard_dim_;
  v.shard_group = shard_group_;
  v.replica = replicate_group_ ? replicate_group_->rank() : 0;
  v.replicate_group = replicate_group_;
  return v;
}

at::Allocator* FsdpParam::full_allocator() const {
  return full_.storage().unsafeGetStorageImpl()->allocator();
}

FsdpParam::~FsdpParam() {
  // While the bytes are attached the storage's deleter refers to full_bytes_, which goes now.
  if (full_.defined()) release_full();
}

FsdpParam::FsdpParam(FsdpParam&&) noexcept = default;

const at::Tensor& FsdpParam::attach_full(at::DataPtr bytes) {
  auto* storage = full_.storage().unsafeGetStorageImpl();
  // Wrapped, so that the storage carries the shard's mark while the parameter holds it.
  void* data = bytes.get();
  const auto device = bytes.device();
  full_bytes_->inner = std::move(bytes);
  storage->set_data_ptr(at::DataPtr(data, full_bytes_.get(), &release_full_bytes, device));
  storage->set_nbytes(full_nbytes_);
  full_allocated_ = true;
  return full_;
}

void FsdpParam::release_full() {
  if (!full_allocated_) return;
  auto* storage = full_.storage().unsafeGetStorageImpl();
  // Dropping the DataPtr frees the bytes (to the pool); views autograd saved keep the (now
  // empty) storage.
  storage->set_data_ptr(at::DataPtr(nullptr, full_.device()));
  storage->set_nbytes(0);
  full_allocated_ = false;
}

void FsdpParam::use_full() {
  if (holds_full_) return;
  param_.set_data(full_);
  holds_full_ = true;
}

void FsdpParam::use_shard() {
  if (!holds_full_) return;
  param_.set_data(shard_);
  holds_full_ = false;
}

void FsdpParam::adopt_replaced_data() {
  if (holds_full_ || param_.storage().is_alias_of(shard_.storage())) return;
  const auto* mark = shard_mark(shard_);
  FSDP_CHECK_ARG(param_.sizes() == shard_.sizes(),
                 "fsdp: a parameter of unit '{}' was replaced while sharded by a tensor of shape "
                 "{}; its shard on this rank has shape {} (assign rows of the shard's shape, or "
                 "load through fsdp's loaders)",
                 mark ? mark->owner : std::string("?"), c10::str(param_.sizes()),
                 c10::str(shard_.sizes()));
  at::NoGradGuard no_grad;
  shard_.copy_(param_.detach());
  param_.set_data(shard_);
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
