#include <atomic>

#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {
namespace {

cudaStream_t legacy_default_stream(int) { return nullptr; }

std::atomic<CudaStreamProvider>& provider() {
  static std::atomic<CudaStreamProvider> p{&legacy_default_stream};
  return p;
}

}  // namespace

void set_cuda_stream_provider(CudaStreamProvider p) { provider().store(p); }

cudaStream_t current_cuda_stream(int device) { return provider().load()(device); }

CudaDeviceGuard::CudaDeviceGuard(int device) {
  cudaGetDevice(&previous_);
  if (previous_ != device) cudaSetDevice(device);
}

CudaDeviceGuard::~CudaDeviceGuard() { cudaSetDevice(previous_); }

}  // namespace fsdp::detail
