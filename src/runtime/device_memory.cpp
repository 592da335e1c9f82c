#include "fsdp/device_memory.h"

#include <sys/resource.h>

namespace fsdp {

int64_t host_peak_rss_bytes() {
  struct rusage usage {};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return -1;
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

#ifndef FSDP_HAVE_TORCH_CUDA
int64_t cuda_peak_allocated_bytes(int) { return -1; }
void cuda_reset_peak_allocated_bytes(int) {}
#endif

}  // namespace fsdp
