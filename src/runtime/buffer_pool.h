// Internal: reuse of the runtime's large CPU buffers (gathered parameters, collective buffers)
// across steps. glibc returns blocks above its (dynamic, up to 32 MiB) mmap threshold to the
// kernel and keeps smaller ones in fragmented heaps, so allocating and freeing the same few
// multi-MB buffers every step costs page faults and leaves RSS well above what is in use.
// Buffers are kept by exact size; a pool holds at most what was alive at once, which the
// accounting already counts. CUDA's caching allocator does this itself, so CUDA bypasses it.
#pragma once

#include <ATen/ATen.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace fsdp::detail {

class BufferPool : public std::enable_shared_from_this<BufferPool> {
 public:
  // A tensor of `numel` elements (contents undefined), reused when one of that size is free.
  at::Tensor take(int64_t numel, const at::TensorOptions& options);
  // Hands a tensor from take() back (it must have no other users).
  void give(at::Tensor buffer);
  // Storage bytes for a StorageImpl: they return to this pool when the DataPtr is dropped.
  at::DataPtr take_bytes(int64_t nbytes, c10::Device device, at::Allocator* fallback);
  int64_t pooled_bytes() const { return pooled_bytes_; }

 private:
  using Key = std::tuple<int64_t, at::ScalarType>;
  std::map<Key, std::vector<at::Tensor>> free_;
  int64_t pooled_bytes_ = 0;
};

}  // namespace fsdp::detail
