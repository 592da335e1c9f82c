#include "fsdp/device_memory.h"

#include <sys/resource.h>

#ifdef FSDP_HAVE_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace fsdp {

int64_t host_peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

#ifdef FSDP_HAVE_TORCH_CUDA
int64_t cuda_peak_allocated_bytes(int device) {
  auto stats =
      c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
  return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
      .peak;
}

void cuda_reset_peak_allocated_bytes(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}
#else
int64_t cuda_peak_allocated_bytes(int) { return -1; }
void cuda_reset_peak_allocated_bytes(int) {}
#endif

}  // namespace fsdp
