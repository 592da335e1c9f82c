#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>

#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {

cudaStream_t current_cuda_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

bool cuda_primary_context_exists(int device) {
  return c10::cuda::hasPrimaryContext(static_cast<c10::DeviceIndex>(device));
}

}  // namespace fsdp::detail
