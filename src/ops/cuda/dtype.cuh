// Device-side conversions between the kernels' dtypes (DType) and float32, and the dispatch
// from a DType to its CUDA type; shared by this folder's kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <type_traits>

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

// The packed kernels' choice, in one place: calls f(std::integral_constant<int, N>{}) with N the
// elements of T in 16 bytes when `length` divides into such packs and every pointer in `p` is
// on a 16-byte boundary (null is), else with N = 1. Rows of `length` elements then all start on
// a boundary when the first does.
template <typename T, typename F, typename... Ptr>
inline void by_pack(int64_t length, F&& f, const Ptr*... p) {
  constexpr int kPack = 16 / sizeof(T);
  if (length % kPack == 0 && ((reinterpret_cast<std::uintptr_t>(p) % 16 == 0) && ...)) {
    f(std::integral_constant<int, kPack>{});
  } else {
    f(std::integral_constant<int, 1>{});
  }
}

#ifdef FSDP_CUDA_EMULATOR
// tests/ops/cuda_emulator runs these kernels on the CPU: its launch, shared memory and limits.
using cuda_emulator::dynamic_shared;
using cuda_emulator::launch;
using cuda_emulator::narrow_index_limit;
using cuda_emulator::strided_blocks;
#else
// min(wanted, limit): the blocks of a grid dimension that its kernel covers with a grid-stride
// loop (a block then takes rows b, b + blocks, ...). Under the emulator a test can lower the
// limit (to 2), so that at its sizes a block takes several rows and the barriers guarding a
// shared buffer's reuse from one row to the next run.
inline int64_t strided_blocks(int64_t wanted, int64_t limit) {
  return wanted < limit ? wanted : limit;
}

// Offsets below this fit a kernel's 32-bit index arithmetic; under the emulator a test can lower
// it to 0 to run the 64-bit path at small sizes.
inline int64_t narrow_index_limit() { return int64_t{UINT32_MAX}; }

// kernel<<<grid, block, shared, stream>>>(args...): every launch of this folder goes through
// here, the one place the CPU emulation of the kernels (tests/ops/cuda_emulator) replaces.
template <typename... Params, typename... Args>
inline void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared,
                   cudaStream_t stream, Args... args) {
  // clang-format reads this header as C++, where <<< is no token.
  // clang-format off
  kernel<<<grid, block, shared, stream>>>(args...);
  // clang-format on
}

// The block's dynamic shared memory (the launch's `shared` bytes), 16-byte aligned.
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ float4 fsdp_dynamic_shared[];
  return reinterpret_cast<T*>(fsdp_dynamic_shared);
}
#endif

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
