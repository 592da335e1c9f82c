// Built only against a CUDA libtorch (PyTorch 2.x wheels): makes the NCCL backend order its
// collectives after the caller's current c10 stream instead of the legacy default stream.
#include <c10/cuda/CUDAStream.h>

#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {
namespace {

cudaStream_t c10_current_stream(int device) {
  return c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
}

const bool registered = [] {
  set_cuda_stream_provider(&c10_current_stream);
  return true;
}();

}  // namespace
}  // namespace fsdp::detail
