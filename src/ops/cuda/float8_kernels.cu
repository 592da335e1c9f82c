// float8_kernels.h: the largest magnitude (a grid-stride loop, a block reduction, one atomic per
// block) and the cast (elementwise for the row-major result alone; 32 x 32 tiles through shared
// memory when the transpose is wanted, so that both results are written row by row); and the
// rowwise recipe's axiswise casts (a block per row, or column maxima with atomics, then scales,
// then an elementwise cast).
#include <cuda_fp8.h>

#include <algorithm>

#include "dtype.cuh"
#include "float8_kernels.h"

namespace fsdp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTile = 32;     // the transposing cast's tile: kTile x kTile elements
constexpr int kTileRows = 8;  // its block: kTile x kTileRows threads, kTile / kTileRows rows each

// |v| as unsigned bits: for values of one sign, the order of the bits is the order of the
// numbers, and a NaN (its sign cleared) is above +inf, so the maximum of the bits is the
// largest magnitude and a NaN wins, as ATen's max propagates it.
__device__ __forceinline__ unsigned abs_bits(float v) { return __float_as_uint(fabsf(v)); }

// The largest m of the block's kThreads threads, returned to every thread: each warp's by
// shuffles, then the warps' through shared memory.
__device__ unsigned block_max(unsigned m) {
  __shared__ unsigned warp_max[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  unsigned all = 0;
  for (int w = 0; w < kThreads / 32; ++w) all = max(all, warp_max[w]);
  __syncthreads();  // warp_max is refilled by the next call
  return all;
}

template <typename T>
__global__ void abs_max_kernel(const T* __restrict__ x, int64_t numel, unsigned* __restrict__ out) {
  unsigned m = 0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    m = max(m, abs_bits(to_f(x[i])));
  }
  // The block's maximum, then one atomic per block: one per warp put up to 32,768 atomics on
  // the one address at once (4096 blocks of 8 warps, all ending their loops together).
  m = block_max(m);
  if (threadIdx.x == 0 && m != 0) atomicMax(out, m);
}

__device__ __forceinline__ double format_max(Float8Format f) {
  return f == Float8Format::kE4M3 ? 448.0 : 57344.0;  // torch.finfo(...).max
}

// torchao's amax_to_scale in float64 (float8.cpp's float8_scale: clamp_min, reciprocal, times
// the maximum, to float32). The comparison keeps a NaN amax NaN, as clamp_min does.
__device__ __forceinline__ float scale_of(float amax, Float8Format f) {
  double a = static_cast<double>(amax);
  a = a < 1e-12 ? 1e-12 : a;
  const double r = 1.0 / a;
  return __double2float_rn(__dmul_rn(r, format_max(f)));
}

// The block's scale: from the amax (thread 0 of block 0 writes it out) or the given one.
__device__ __forceinline__ float block_scale(Float8Format f, const float* amax, float* scale) {
  if (amax == nullptr) return *scale;
  const float s = scale_of(*amax, f);
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0 && threadIdx.y == 0) *scale = s;
  return s;
}

// float32(v) * scale, clamped (by comparisons, which keep NaN), rounded to nearest even.
template <typename T>
__device__ __forceinline__ __nv_fp8_storage_t to_fp8(T v, float scale, Float8Format f) {
  const float m = static_cast<float>(format_max(f));
  float s = __fmul_rn(to_f(v), scale);
  s = s < -m ? -m : (s > m ? m : s);
  return __nv_cvt_float_to_fp8(s, __NV_SATFINITE, f == Float8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
}

template <typename T>
__global__ void cast_kernel(const T* __restrict__ x, int64_t numel, Float8Format f,
                            const float* amax, float* scale, __nv_fp8_storage_t* __restrict__ out) {
  const float s = block_scale(f, amax, scale);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_fp8(x[i], s, f);
  }
}

// The transposing cast's tile in shared memory: kTile rows of kTile bytes, each padded by one
// byte against bank conflicts on the column reads. Outside the kernel template (its bytes do not
// depend on the input's type) so that the CPU emulator (tests/ops/cuda_emulator) resets it before
// each block: GCC ignores the section that puts it there for a static of a function template.
__device__ __forceinline__ auto transpose_tile() -> __nv_fp8_storage_t (*)[kTile + 1] {
  __shared__ __nv_fp8_storage_t tile[kTile][kTile + 1];
  return tile;
}

// One kTile x kTile tile per block and step: read and cast row by row (writing `out`'s rows),
// then write the tile's columns as `out_t`'s rows.
template <typename T>
__global__ void cast_transpose_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      Float8Format f, const float* amax, float* scale,
                                      __nv_fp8_storage_t* __restrict__ out,
                                      __nv_fp8_storage_t* __restrict__ out_t, int64_t ld_t) {
  auto* tile = transpose_tile();
  const float s = block_scale(f, amax, scale);
  const int64_t tiles_r = (rows + kTile - 1) / kTile;
  const int64_t c0 = static_cast<int64_t>(blockIdx.x) * kTile;
  for (int64_t tr = blockIdx.y; tr < tiles_r; tr += gridDim.y) {  // uniform over the block
    const int64_t r0 = tr * kTile;
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t r = r0 + j, c = c0 + threadIdx.x;
      if (r < rows && c < cols) {
        const auto v = to_fp8(x[r * cols + c], s, f);
        if (out != nullptr) out[r * cols + c] = v;
        tile[j][threadIdx.x] = v;
      }
    }
    __syncthreads();
    for (int j = threadIdx.y; j < kTile; j += kTileRows) {
      const int64_t c = c0 + j, r = r0 + threadIdx.x;
      if (r < rows && c < cols) out_t[c * ld_t + r] = tile[threadIdx.x][j];
    }
    __syncthreads();  // the tile is refilled by the next step
  }
}

// torchao's _round_scale_down_to_power_of_2 as ATen computes it on float32 (log2, floor, exp2:
// the same CUDA math functions ATen's kernels call). Where log2f rounds up to a whole number
// (s just below a power of 2) the result is that power, above s, as ATen's is too.
__device__ __forceinline__ float power_of_2_scale(float s) { return exp2f(floorf(log2f(s))); }

// Axis 1: a block per row (a grid-stride loop over the rows): the row's largest magnitude (the
// bits' maximum, NaN above all), its scale, then the row's cast.
template <typename T>
__global__ void cast_rows_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                 Float8Format f, float* __restrict__ scale,
                                 __nv_fp8_storage_t* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {  // uniform over the block
    const T* xr = x + r * cols;
    unsigned m = 0;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) m = max(m, abs_bits(to_f(xr[c])));
    const float s = power_of_2_scale(scale_of(__uint_as_float(block_max(m)), f));
    if (threadIdx.x == 0) scale[r] = s;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) out[r * cols + c] = to_fp8(xr[c], s, f);
  }
}

// Axis 0, first pass: each thread a column over a run of kColumnRun rows, the maxima combined
// with one atomic per thread into bits[col] (zeroed before).
constexpr int64_t kColumnRun = 64;

template <typename T>
__global__ void column_abs_max_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                      unsigned* __restrict__ bits) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  for (int64_t r0 = blockIdx.y * kColumnRun; r0 < rows; r0 += gridDim.y * kColumnRun) {
    unsigned m = 0;
    const int64_t end = r0 + kColumnRun < rows ? r0 + kColumnRun : rows;
    for (int64_t r = r0; r < end; ++r) m = max(m, abs_bits(to_f(x[r * cols + c])));
    if (m != 0) atomicMax(&bits[c], m);
  }
}

// Axis 0, second pass: each column's amax bits turned into its scale, in place.
__global__ void column_scales_kernel(float* __restrict__ scale, int64_t cols, Float8Format f) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c < cols) scale[c] = power_of_2_scale(scale_of(scale[c], f));
}

// Axis 0, the cast: a thread per column (its scale read once), down the rows blockIdx.y,
// + gridDim.y, ... (no division per element; a warp writes consecutive columns).
template <typename T>
__global__ void cast_columns_kernel(const T* __restrict__ x, int64_t rows, int64_t cols,
                                    Float8Format f, const float* __restrict__ scale,
                                    __nv_fp8_storage_t* __restrict__ out) {
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  const float s = scale[c];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    out[r * cols + c] = to_fp8(x[r * cols + c], s, f);
}

unsigned grid_for(int64_t numel) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, strided_blocks((numel + kThreads - 1) / kThreads, 4096)));
}

}  // namespace

cudaError_t abs_max(DType dtype, const void* x, int64_t numel, float* amax, cudaStream_t stream) {
  if (const auto e = cudaMemsetAsync(amax, 0, sizeof(float), stream); e != cudaSuccess) return e;
  if (numel == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    launch(abs_max_kernel<T>, grid_for(numel), kThreads, 0, stream, static_cast<const T*>(x), numel,
           reinterpret_cast<unsigned*>(amax));
  });
}

cudaError_t float8_cast(DType dtype, Float8Format format, const void* x, int64_t rows, int64_t cols,
                        const float* amax, float* scale, void* out, void* out_t, int64_t ld_t,
                        cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  if (out_t != nullptr && ld_t < rows) return cudaErrorInvalidValue;
  auto* o = static_cast<__nv_fp8_storage_t*>(out);
  auto* ot = static_cast<__nv_fp8_storage_t*>(out_t);
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto* xs = static_cast<const T*>(x);
    if (ot == nullptr) {
      if (o == nullptr) return;
      launch(cast_kernel<T>, grid_for(rows * cols), kThreads, 0, stream, xs, rows * cols, format,
             amax, scale, o);
      return;
    }
    const dim3 block(kTile, kTileRows);
    const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile),
                    static_cast<unsigned>(strided_blocks((rows + kTile - 1) / kTile, 65535)));
    launch(cast_transpose_kernel<T>, grid, block, 0, stream, xs, rows, cols, format, amax, scale, o,
           ot, ld_t);
  });
}

cudaError_t float8_cast_axiswise(DType dtype, Float8Format format, const void* x, int64_t rows,
                                 int64_t cols, int axis, float* scale, void* out,
                                 cudaStream_t stream) {
  if (axis != 0 && axis != 1) return cudaErrorInvalidValue;
  if (rows == 0 || cols == 0) return cudaSuccess;
  auto* o = static_cast<__nv_fp8_storage_t*>(out);
  if (axis == 0) {
    // The amaxes accumulate as bits in the scales' own storage (0 is +0.0, below every bit
    // pattern of a magnitude).
    if (const auto e = cudaMemsetAsync(scale, 0, cols * sizeof(float), stream); e != cudaSuccess) {
      return e;
    }
  }
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto* xs = static_cast<const T*>(x);
    if (axis == 1) {
      const auto blocks = static_cast<unsigned>(strided_blocks(rows, 65535));
      launch(cast_rows_kernel<T>, blocks, kThreads, 0, stream, xs, rows, cols, format, scale, o);
      return;
    }
    const auto column_blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
    const dim3 grid(column_blocks, static_cast<unsigned>(strided_blocks(
                                       (rows + kColumnRun - 1) / kColumnRun, 65535)));
    launch(column_abs_max_kernel<T>, grid, kThreads, 0, stream, xs, rows, cols,
           reinterpret_cast<unsigned*>(scale));
    launch(column_scales_kernel, column_blocks, kThreads, 0, stream, scale, cols, format);
    const dim3 cast_grid(column_blocks, static_cast<unsigned>(strided_blocks(rows, 1024)));
    launch(cast_columns_kernel<T>, cast_grid, kThreads, 0, stream, xs, rows, cols, format, scale,
           o);
  });
}

}  // namespace fsdp::ops::cuda
