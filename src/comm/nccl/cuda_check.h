// Internal: CUDA/NCCL error checks that throw CommError, and the caller's current stream.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "fsdp/errors.h"

namespace fsdp::detail {

// The stream on which the caller's tensor work runs on `device`: c10's current stream, so
// collectives order after whatever the caller queued there (a CUDAStreamGuard included).
cudaStream_t current_cuda_stream(int device);

// Whether `device`'s primary context exists (c10::cuda::hasPrimaryContext): making a device
// current creates its context (CUDA 12 and later), about 0.5 GiB of the GPU's memory.
bool cuda_primary_context_exists(int device);

// Makes `device` current for the scope. Sets nothing when it already is, and puts the previous
// device back only when it changed it and the previous device's context exists: a thread that
// never used a device (CUDA reports device 0 for it) must not create a context on GPU 0 on its
// way out, which every process of an 8-GPU job would otherwise do (0.5 GiB each, and a failure
// where the GPUs are in exclusive-process mode).
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1: nothing to put back
};

}  // namespace fsdp::detail

#define FSDP_CUDA_CHECK(call, op, rank, world)                                                     \
  do {                                                                                             \
    cudaError_t fsdp_cuda_rc_ = (call);                                                            \
    if (fsdp_cuda_rc_ != cudaSuccess) {                                                            \
      throw ::fsdp::CommError("nccl", op, rank, world,                                             \
                              fmt::format("{} returned {} ({}:{})", #call,                         \
                                          cudaGetErrorString(fsdp_cuda_rc_), __FILE__, __LINE__)); \
    }                                                                                              \
  } while (0)

#define FSDP_NCCL_CHECK(call, op, rank, world)                                                \
  do {                                                                                        \
    ncclResult_t fsdp_nccl_rc_ = (call);                                                      \
    if (fsdp_nccl_rc_ != ncclSuccess) {                                                       \
      throw ::fsdp::CommError(                                                                \
          "nccl", op, rank, world,                                                            \
          fmt::format("{} returned {}: {} ({}:{})", #call, ncclGetErrorString(fsdp_nccl_rc_), \
                      ncclGetLastError(nullptr), __FILE__, __LINE__));                        \
    }                                                                                         \
  } while (0)
