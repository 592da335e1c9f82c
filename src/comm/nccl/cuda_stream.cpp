#include <c10/cuda/CUDAStream.h>

#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {

cudaStream_t current_cuda_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

CudaDeviceGuard::CudaDeviceGuard(int device) {
  cudaGetDevice(&previous_);
  if (previous_ != device) cudaSetDevice(device);
}

CudaDeviceGuard::~CudaDeviceGuard() { cudaSetDevice(previous_); }

}  // namespace fsdp::detail
