// Built only against a CUDA libtorch (PyTorch 2.x wheels); Debian's libtorch cannot compile
// c10/cuda headers (LIBTORCH_NOTES.md). Two pieces of glue:
// - the NCCL backend orders its collectives after the caller's current c10 stream instead of
//   the legacy default stream;
// - peak memory comes from the CUDA caching allocator.
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include "comm/nccl/cuda_check.h"
#include "fsdp/device_memory.h"

namespace fsdp {
namespace detail {
namespace {

cudaStream_t c10_current_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

const bool registered = [] {
  set_cuda_stream_provider(&c10_current_stream);
  return true;
}();

}  // namespace
}  // namespace detail

int64_t cuda_peak_allocated_bytes(int device) {
  auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  // Index 0 is StatType::AGGREGATE, whose namespace moved between libtorch 2.x releases.
  return stats.allocated_bytes[0].peak;
}

void cuda_reset_peak_allocated_bytes(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

}  // namespace fsdp
