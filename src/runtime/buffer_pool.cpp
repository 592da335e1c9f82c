#include "runtime/buffer_pool.h"

namespace fsdp::detail {
namespace {

// What a pooled DataPtr carries: the buffer that owns the bytes and the pool to return it to.
struct PooledBytes {
  std::weak_ptr<BufferPool> pool;
  at::Tensor buffer;
};

void return_bytes(void* ctx) {
  auto* pooled = static_cast<PooledBytes*>(ctx);
  if (auto pool = pooled->pool.lock()) pool->give(std::move(pooled->buffer));
  delete pooled;
}

}  // namespace

at::Tensor BufferPool::take(int64_t numel, const at::TensorOptions& options) {
  if (options.device().type() != at::kCPU) return at::empty({numel}, options);
  auto it = free_.find(Key{numel, options.dtype().toScalarType()});
  if (it == free_.end() || it->second.empty()) return at::empty({numel}, options);
  at::Tensor t = std::move(it->second.back());
  it->second.pop_back();
  pooled_bytes_ -= static_cast<int64_t>(t.nbytes());
  return t;
}

void BufferPool::give(at::Tensor buffer) {
  if (!buffer.defined() || buffer.device().type() != at::kCPU) return;
  pooled_bytes_ += static_cast<int64_t>(buffer.nbytes());
  free_[Key{buffer.numel(), buffer.scalar_type()}].push_back(std::move(buffer));
}

at::DataPtr BufferPool::take_bytes(int64_t nbytes, c10::Device device, at::Allocator* fallback) {
  if (device.type() != at::kCPU) return fallback->allocate(nbytes);
  auto buffer = take(nbytes, at::TensorOptions().dtype(at::kByte).device(device));
  void* data = buffer.data_ptr();
  auto* ctx = new PooledBytes{weak_from_this(), std::move(buffer)};
  return at::DataPtr(data, ctx, &return_bytes, device);
}

}  // namespace fsdp::detail
