// Internal: CUDA/NCCL error checks that throw CommError, and the caller's current stream.
#pragma once

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "fsdp/errors.h"

namespace fsdp::detail {

// The stream on which the caller's tensor work runs on `device`: c10's current stream, so
// collectives order after whatever the caller queued there (a CUDAStreamGuard included).
cudaStream_t current_cuda_stream(int device);

// Makes `device` current for the scope, restoring the previous one.
class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int device);
  ~CudaDeviceGuard();
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
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
