// Device-side conversions between the kernels' dtypes (DType) and float32, and the dispatch
// from a DType to its CUDA type; shared by this folder's kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

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

// N elements of T loaded or stored as one access (16 bytes: 8 bf16 or half, 4 float), where the
// address is aligned to it: a warp then moves 512 bytes per instruction instead of 64 or 128.
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Whether every pointer is on a 16-byte boundary: the packed path's condition (with a length
// that divides into packs).
template <typename... P>
inline bool aligned16(const P*... p) {
  return ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...);
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
