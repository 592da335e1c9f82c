// Device-side conversions between the kernels' dtypes (DType) and float32, and the dispatch
// from a DType to its CUDA type; shared by this folder's kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include "fused_kernels.h"

namespace fsdp::ops::cuda {

template <typename T>
__device__ __forceinline__ float to_f(T v) {
  return static_cast<float>(v);
}
template <>
__device__ __forceinline__ float to_f(__nv_bfloat16 v) {
  return __bfloat162float(v);
}
template <>
__device__ __forceinline__ float to_f(__half v) {
  return __half2float(v);
}

template <typename T>
__device__ __forceinline__ T from_f(float v) {
  return static_cast<T>(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_f(float v) {
  return __float2half_rn(v);
}

// x rounded to T and back: where the ATen twin stores an intermediate in the tensor's dtype.
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_f(from_f<T>(v));
}

template <typename F>
inline cudaError_t by_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat:
      f(float{});
      break;
    case DType::kBFloat16:
      f(__nv_bfloat16{});
      break;
    case DType::kHalf:
      f(__half{});
      break;
  }
  return cudaGetLastError();
}

}  // namespace fsdp::ops::cuda
