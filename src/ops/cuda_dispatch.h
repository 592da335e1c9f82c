// What the ops' host code needs to run this folder's CUDA kernels (only in builds with them,
// FSDP_HAVE_CUDA_KERNELS): the kernels' dtype of a tensor, the device check, the stream, and a
// launch error as fsdp::Error.
#pragma once

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "fsdp/errors.h"
#include "ops/cuda/fused_kernels.h"

namespace fsdp::ops::detail {

inline std::optional<cuda::DType> kernel_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return cuda::DType::kFloat;
    case at::kBFloat16:
      return cuda::DType::kBFloat16;
    case at::kHalf:
      return cuda::DType::kHalf;
    default:
      return std::nullopt;
  }
}

inline void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw fsdp::Error(std::string("fsdp::ops::") + what + ": " + cudaGetErrorString(e));
  }
}

// FSDP_CUDA_KERNELS=0 in the environment turns the kernels off for the process (read once): the
// ops run their ATen twins, to compare a run with and without them or to step around one.
inline bool kernels_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("FSDP_CUDA_KERNELS");
    return v == nullptr || std::strcmp(v, "0") != 0;
  }();
  return on;
}

// Whether the kernels run on this tensor: a CUDA tensor of a kernel dtype (kernel_dtype), with
// the kernels enabled, on a GPU of compute capability 8.0 or newer (they are built for sm_80 and
// sm_90 and their PTX; asked once per device). An older GPU gets the twins. A launch the driver
// refuses (PTX newer than the driver, say) is not foreseen here: check_launch throws
// fsdp::Error naming the op, and FSDP_CUDA_KERNELS=0 steps around it.
inline bool kernels_run_on(const at::Tensor& t) {
  if (!kernels_enabled() || !t.is_cuda() || !kernel_dtype(t.scalar_type())) return false;
  static std::array<std::atomic<int>, 64> known{};  // 0 unknown, 1 yes, 2 no
  const int d = t.device().index();
  if (d < 0 || d >= static_cast<int>(known.size())) return false;
  int k = known[d].load();
  if (k == 0) {
    const auto* props = at::cuda::getDeviceProperties(d);
    k = props->major >= 8 ? 1 : 2;
    known[d].store(k);
  }
  return k == 1;
}

inline cudaStream_t stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace fsdp::ops::detail

#endif  // FSDP_HAVE_CUDA_KERNELS
