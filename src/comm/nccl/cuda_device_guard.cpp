#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {

CudaDeviceGuard::CudaDeviceGuard(int device) {
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess) {
    cudaGetLastError();  // no device at all: the call below reports it
    current = -1;
  }
  if (current == device) return;
  cudaSetDevice(device);
  // A thread that never chose a device reads device 0 without a context on it: putting 0 back
  // would create one (the class comment).
  if (current >= 0 && cuda_primary_context_exists(current)) previous_ = current;
}

CudaDeviceGuard::~CudaDeviceGuard() {
  if (previous_ >= 0) cudaSetDevice(previous_);
}

}  // namespace fsdp::detail
