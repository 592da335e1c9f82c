// fused_kernels.h: RMSNorm (one block per row, a warp-shuffle reduction), SwiGLU and the rotary
// embedding (grid-stride elementwise loops; the rotary one a thread per pair of elements i and
// i + d/2), forward and backward, for float, bfloat16 and half. RMSNorm and SwiGLU read and
// write 16-byte packs where the lengths and pointers allow (a warp moves 512 bytes per
// instruction instead of 64 or 128), single elements elsewhere.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "dtype.cuh"
#include "fused_kernels.h"

namespace fsdp::ops::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks of the RMSNorm backward: each sums its rows' weight-gradient parts and writes them to
// its own row of the workspace, which a second kernel sums over the blocks. 512 keeps about four
// blocks of 256 threads on each of an H100's or H200's 132 SMs (256 left half of them idle).
constexpr int64_t kBackwardBlocks = 512;
// Up to this many columns a block keeps its weight-gradient parts in shared memory; wider rows
// keep them in the workspace (global memory: a read and a write per element and row). A block
// gets 48 KB of shared memory without opting in, static (block_sum's 32 bytes) and dynamic
// together: 47 KB of floats leaves the static part room.
constexpr int64_t kSharedDwColumns = 47 * 1024 / sizeof(float);
// The workspace's sum: a block per 32 columns, kSumRows rows of 32 threads.
constexpr int kSumRows = 8;

// The sum of v over the block (every thread gets it).
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float total = 0;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();  // partial is reused by the next call
  return total;
}

// The norm's kernels read and write a row as packs of N elements (16 bytes where the row length
// and the pointers allow, else N = 1); a thread takes packs threadIdx.x, + kThreads, ...

// With kResidual, the row normalised is h = cast(x + y), which is also written out (the fused
// residual add); otherwise h is x.
template <typename T, bool kResidual, int N>
__global__ void rms_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ y,
                                        T* __restrict__ h, const T* __restrict__ w,
                                        T* __restrict__ out, float* __restrict__ rstd, int64_t n,
                                        int64_t d, float eps) {
  using P = Pack<T, N>;
  const int64_t packs = d / N;
  const P* wp = reinterpret_cast<const P*>(w);
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {  // uniform over the block
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    P* hr = reinterpret_cast<P*>(kResidual ? h + row * d : nullptr);
    P* outr = reinterpret_cast<P*>(out + row * d);
    float sumsq = 0;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      P v = xr[i];
      if (kResidual) {
        const P yv = reinterpret_cast<const P*>(y + row * d)[i];
#pragma unroll
        for (int k = 0; k < N; ++k) v.v[k] = from_f<T>(__fadd_rn(to_f(v.v[k]), to_f(yv.v[k])));
        hr[i] = v;  // read back below by this thread alone
      }
#pragma unroll
      for (int k = 0; k < N; ++k) sumsq += to_f(v.v[k]) * to_f(v.v[k]);
    }
    const float r = rsqrtf(block_sum(sumsq) / static_cast<float>(d) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    const P* normed = kResidual ? hr : xr;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const P v = normed[i], wv = wp[i];
      P o;
      // LlamaRMSNorm: the normalised value cast to the input's dtype, then times the weight.
#pragma unroll
      for (int k = 0; k < N; ++k) o.v[k] = from_f<T>(to_f(wv.v[k]) * round_to<T>(to_f(v.v[k]) * r));
      outr[i] = o;
    }
  }
}

// N floats moved as one access where they make 16 bytes (and 32 bytes as two), else one by one.
template <int N>
struct alignas(N * sizeof(float) < 16 ? N * sizeof(float) : 16) FloatParts {
  float v[N];
};

// dx, and (partial_dw not null) the block's rows' weight-gradient parts in its row of
// partial_dw. A thread owns the columns of its packs: no two threads touch one part, so the
// parts need no barrier.
template <typename T, int N>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         const T* __restrict__ w, const float* __restrict__ rstd,
                                         T* __restrict__ dx, float* __restrict__ partial_dw,
                                         int64_t n, int64_t d) {
  using P = Pack<T, N>;
  using Parts = FloatParts<N>;
  // d floats where d <= kSharedDwColumns and dw is wanted.
  float* const shared_dw = dynamic_shared<float>();
  const bool want_dw = partial_dw != nullptr, in_shared = d <= kSharedDwColumns;
  const int64_t packs = d / N;
  // The block's parts in the workspace, in column order: pack i's N parts are block_dw[i], one
  // access (in the packed path partial_dw is 16-byte aligned, by_pack's check, and so each
  // block's row, as d divides into packs).
  Parts* const block_dw = want_dw ? reinterpret_cast<Parts*>(partial_dw + blockIdx.x * d) : nullptr;
  // In shared memory, the part of column i N + k is k-major, so that the threads of a warp
  // (packs i, i + 1, ...) hit consecutive banks (in column order, N-way bank conflicts).
  const auto shared_part = [&](int64_t i, int k) -> float& { return shared_dw[k * packs + i]; };
  const P* wp = reinterpret_cast<const P*>(w);
  if (want_dw) {
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      if (in_shared) {
#pragma unroll
        for (int k = 0; k < N; ++k) shared_part(i, k) = 0;
      } else {
        block_dw[i] = Parts{};
      }
    }
  }
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const P* dyr = reinterpret_cast<const P*>(dy + row * d);
    const P* xr = reinterpret_cast<const P*>(x + row * d);
    P* dxr = reinterpret_cast<P*>(dx + row * d);
    const float r = rstd[row];
    // d(loss)/d(normalised) = dy * w in the dtype (the twin's product), then float32.
    float dot = 0;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const P dyv = dyr[i], xv = xr[i], wv = wp[i];
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float g = round_to<T>(to_f(dyv.v[k]) * to_f(wv.v[k]));
        dot += g * to_f(xv.v[k]) * r;
      }
    }
    dot = block_sum(dot) / static_cast<float>(d);
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      const P dyv = dyr[i], xv = xr[i], wv = wp[i];
      P dxv;
      Parts add;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        const float hv = to_f(xv.v[k]) * r;
        const float g = round_to<T>(to_f(dyv.v[k]) * to_f(wv.v[k]));
        dxv.v[k] = from_f<T>(r * (g - hv * dot));
        add.v[k] = to_f(dyv.v[k]) * round_to<T>(hv);
      }
      dxr[i] = dxv;
      if (!want_dw) continue;
      if (in_shared) {
#pragma unroll
        for (int k = 0; k < N; ++k) shared_part(i, k) += add.v[k];
      } else {
        Parts sum = block_dw[i];
#pragma unroll
        for (int k = 0; k < N; ++k) sum.v[k] += add.v[k];
        block_dw[i] = sum;
      }
    }
  }
  if (want_dw && in_shared) {  // each thread copies out the parts it summed, in column order
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      Parts sum;
#pragma unroll
      for (int k = 0; k < N; ++k) sum.v[k] = shared_part(i, k);
      block_dw[i] = sum;
    }
  }
}

// out[c] = the sum of partial's `blocks` rows in column c: thread (x, y) of the block for
// columns 32 b .. 32 b + 31 sums rows y, y + kSumRows, ... of its column (a warp reads 128
// contiguous bytes), then the kSumRows sums of each column are added.
__global__ void sum_blocks_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                  int64_t blocks, int64_t d) {
  __shared__ float sums[kSumRows][33];  // 33: no bank conflicts
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  float s = 0;
  if (c < d) {
    for (int64_t b = threadIdx.y; b < blocks; b += kSumRows) s += partial[b * d + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < d) {
    for (int y = 1; y < kSumRows; ++y) s += sums[y][threadIdx.x];
    out[c] = s;
  }
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

// silu(gate) is a tensor of the dtype in the twin, then times up.
template <typename T>
__device__ __forceinline__ T swiglu(float g, float u) {
  return from_f<T>(round_to<T>(g * sigmoid(g)) * u);
}

// The gradients of gate and up from the output's, `go`.
template <typename T>
__device__ __forceinline__ void swiglu_grads(float g, float u, float go, T& dgate, T& dup) {
  const float s = sigmoid(g);
  const float a = round_to<T>(g * s);    // silu(gate) in the dtype
  const float da = round_to<T>(go * u);  // the product's gradient to silu(gate)
  dup = from_f<T>(go * a);
  dgate = from_f<T>(da * s * (1.0f + g * (1.0f - s)));
}

// Over `packs` packs of N elements (N 1: single elements).
template <typename T, int N>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                                      T* __restrict__ out, int64_t packs) {
  using P = Pack<T, N>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P g = reinterpret_cast<const P*>(gate)[i], u = reinterpret_cast<const P*>(up)[i];
    P o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = swiglu<T>(to_f(g.v[k]), to_f(u.v[k]));
    reinterpret_cast<P*>(out)[i] = o;
  }
}

template <typename T, int N>
__global__ void swiglu_backward_kernel(const T* __restrict__ dout, const T* __restrict__ gate,
                                       const T* __restrict__ up, T* __restrict__ dgate,
                                       T* __restrict__ dup, int64_t packs) {
  using P = Pack<T, N>;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < packs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const P g = reinterpret_cast<const P*>(gate)[i], u = reinterpret_cast<const P*>(up)[i];
    const P go = reinterpret_cast<const P*>(dout)[i];
    P dg, du;
#pragma unroll
    for (int k = 0; k < N; ++k) {
      swiglu_grads<T>(to_f(g.v[k]), to_f(u.v[k]), to_f(go.v[k]), dg.v[k], du.v[k]);
    }
    reinterpret_cast<P*>(dgate)[i] = dg;
    reinterpret_cast<P*>(dup)[i] = du;
  }
}

// The rotary embedding's pair (i, i + half) of one row of x: rotate_half(x) is (-x2, x1), so
//   out[i]        = x[i] c[i] - x[i + half] s[i]
//   out[i + half] = x[i + half] c[i + half] + x[i] s[i + half]
// and the backward's transpose of it
//   dx[i]        = g[i] c[i] + g[i + half] s[i + half]
//   dx[i + half] = g[i + half] c[i + half] - g[i] s[i].
// Each product and each sum rounded to T (the twin's separate ATen ops; __fmul_rn and
// __fadd_rn keep the compiler from fusing them into one fma, which float32 would round once).
// I: the index type, unsigned 32-bit where every element offset fits (3 divisions per pair:
// 64-bit ones are emulated in dozens of instructions each, more than the pair's memory time).
template <typename T, bool kBackward, typename I>
__global__ void rope_kernel(const T* __restrict__ x, const T* __restrict__ cos,
                            const T* __restrict__ sin, T* __restrict__ out, I batch, I seq, I heads,
                            I d, I cos_batch) {
  const I half = d / 2;
  const I pairs = batch * seq * heads * half;
  for (I p = blockIdx.x * static_cast<I>(blockDim.x) + threadIdx.x; p < pairs;
       p += static_cast<I>(gridDim.x) * blockDim.x) {
    const I row = p / half, i = p - row * half;  // row of x: (b, s, h)
    const I position = row / heads, b_index = position / seq, s_index = position - b_index * seq;
    const I cs = ((cos_batch == 1 ? 0 : b_index) * seq + s_index) * d;
    const T* xr = x + row * d;
    const float x1 = to_f(xr[i]), x2 = to_f(xr[i + half]);
    const float c1 = to_f(cos[cs + i]), c2 = to_f(cos[cs + i + half]);
    const float s1 = to_f(sin[cs + i]), s2 = to_f(sin[cs + i + half]);
    float lo, hi;
    if (kBackward) {
      lo = __fadd_rn(round_to<T>(__fmul_rn(x1, c1)), round_to<T>(__fmul_rn(x2, s2)));
      hi = __fadd_rn(round_to<T>(__fmul_rn(x2, c2)), -round_to<T>(__fmul_rn(x1, s1)));
    } else {
      lo = __fadd_rn(round_to<T>(__fmul_rn(x1, c1)), round_to<T>(__fmul_rn(-x2, s1)));
      hi = __fadd_rn(round_to<T>(__fmul_rn(x2, c2)), round_to<T>(__fmul_rn(x1, s2)));
    }
    out[row * d + i] = from_f<T>(lo);
    out[row * d + i + half] = from_f<T>(hi);
  }
}

int64_t elementwise_blocks(int64_t numel) {
  return std::max<int64_t>(1, strided_blocks((numel + kThreads - 1) / kThreads, 65535));
}

// The RMSNorm backward's blocks for n rows, and so its workspace's rows.
int64_t backward_blocks(int64_t n) {
  return strided_blocks(std::max<int64_t>(n, 1), kBackwardBlocks);
}

}  // namespace

int64_t rms_norm_workspace_floats(int64_t n, int64_t d) { return backward_blocks(n) * d; }

namespace {

template <bool kResidual>
cudaError_t rms_norm_forward_rows(DType dtype, const void* x, const void* y, void* h,
                                  const void* weight, void* out, float* rstd, int64_t n, int64_t d,
                                  float eps, cudaStream_t stream) {
  if (n == 0 || d == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto blocks = static_cast<unsigned>(strided_blocks(n, int64_t{1} << 20));
    const auto *xs = static_cast<const T*>(x), *ys = static_cast<const T*>(y),
               *ws = static_cast<const T*>(weight);
    auto *hs = static_cast<T*>(h), *os = static_cast<T*>(out);
    by_pack<T>(
        d,
        [&](auto pack) {
          launch(rms_norm_forward_kernel<T, kResidual, decltype(pack)::value>, blocks, kThreads, 0,
                 stream, xs, ys, hs, ws, os, rstd, n, d, eps);
        },
        xs, ys, hs, ws, os);  // y and h null without the residual
  });
}

}  // namespace

cudaError_t rms_norm_forward(DType dtype, const void* x, const void* weight, void* y, float* rstd,
                             int64_t n, int64_t d, float eps, cudaStream_t stream) {
  return rms_norm_forward_rows<false>(dtype, x, nullptr, nullptr, weight, y, rstd, n, d, eps,
                                      stream);
}

cudaError_t add_rms_norm_forward(DType dtype, const void* x, const void* y, void* h,
                                 const void* weight, void* out, float* rstd, int64_t n, int64_t d,
                                 float eps, cudaStream_t stream) {
  return rms_norm_forward_rows<true>(dtype, x, y, h, weight, out, rstd, n, d, eps, stream);
}

cudaError_t rms_norm_backward(DType dtype, const void* dy, const void* x, const void* weight,
                              const float* rstd, void* dx, float* dweight, float* workspace,
                              int64_t n, int64_t d, cudaStream_t stream) {
  if (d == 0) return cudaSuccess;
  const bool want_dw = dweight != nullptr;
  if (n == 0) {  // no rows: dx is empty, the weight's gradient zero
    return want_dw ? cudaMemsetAsync(dweight, 0, d * sizeof(float), stream) : cudaSuccess;
  }
  const int64_t blocks = backward_blocks(n);
  const size_t shared = want_dw && d <= kSharedDwColumns ? d * sizeof(float) : 0;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto *dys = static_cast<const T*>(dy), *xs = static_cast<const T*>(x),
               *ws = static_cast<const T*>(weight);
    auto* dxs = static_cast<T*>(dx);
    float* parts = want_dw ? workspace : nullptr;
    by_pack<T>(
        d,
        [&](auto pack) {
          launch(rms_norm_backward_kernel<T, decltype(pack)::value>, static_cast<unsigned>(blocks),
                 kThreads, shared, stream, dys, xs, ws, rstd, dxs, parts, n, d);
        },
        dys, xs, ws, dxs, parts);  // parts: FloatParts' alignment (null is)
    if (want_dw) {
      launch(sum_blocks_kernel, static_cast<unsigned>((d + 31) / 32), dim3(32, kSumRows), 0, stream,
             workspace, dweight, blocks, d);
    }
  });
}

cudaError_t swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t numel,
                           cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto *g = static_cast<const T*>(gate), *u = static_cast<const T*>(up);
    auto* o = static_cast<T*>(out);
    by_pack<T>(
        numel,
        [&](auto pack) {
          const int64_t packs = numel / decltype(pack)::value;
          launch(swiglu_forward_kernel<T, decltype(pack)::value>,
                 static_cast<unsigned>(elementwise_blocks(packs)), kThreads, 0, stream, g, u, o,
                 packs);
        },
        g, u, o);
  });
}

cudaError_t swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up,
                            void* dgate, void* dup, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto *go = static_cast<const T*>(dout), *g = static_cast<const T*>(gate),
               *u = static_cast<const T*>(up);
    auto *dg = static_cast<T*>(dgate), *du = static_cast<T*>(dup);
    by_pack<T>(
        numel,
        [&](auto pack) {
          const int64_t packs = numel / decltype(pack)::value;
          launch(swiglu_backward_kernel<T, decltype(pack)::value>,
                 static_cast<unsigned>(elementwise_blocks(packs)), kThreads, 0, stream, go, g, u,
                 dg, du, packs);
        },
        go, g, u, dg, du);
  });
}

namespace {

template <bool kBackward>
cudaError_t rope(DType dtype, const void* x, const void* cos, const void* sin, void* out,
                 int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t cos_batch,
                 cudaStream_t stream) {
  const int64_t pairs = batch * seq * heads * (d / 2);
  if (pairs == 0) return cudaSuccess;
  if (d % 2 != 0 || (cos_batch != 1 && cos_batch != batch)) return cudaErrorInvalidValue;
  // The largest offset: x's elements (cos and sin have no more), and the grid's stride past it.
  const bool narrow =
      batch * seq * heads * d + elementwise_blocks(pairs) * kThreads < narrow_index_limit();
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto blocks = static_cast<unsigned>(elementwise_blocks(pairs));
    const auto *xs = static_cast<const T*>(x), *cs = static_cast<const T*>(cos),
               *ss = static_cast<const T*>(sin);
    auto* os = static_cast<T*>(out);
    if (narrow) {
      launch(rope_kernel<T, kBackward, uint32_t>, blocks, kThreads, 0, stream, xs, cs, ss, os,
             static_cast<uint32_t>(batch), static_cast<uint32_t>(seq), static_cast<uint32_t>(heads),
             static_cast<uint32_t>(d), static_cast<uint32_t>(cos_batch));
    } else {
      launch(rope_kernel<T, kBackward, int64_t>, blocks, kThreads, 0, stream, xs, cs, ss, os, batch,
             seq, heads, d, cos_batch);
    }
  });
}

}  // namespace

cudaError_t rope_forward(DType dtype, const void* x, const void* cos, const void* sin, void* out,
                         int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t cos_batch,
                         cudaStream_t stream) {
  return rope<false>(dtype, x, cos, sin, out, batch, seq, heads, d, cos_batch, stream);
}

cudaError_t rope_backward(DType dtype, const void* dout, const void* cos, const void* sin, void* dx,
                          int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t cos_batch,
                          cudaStream_t stream) {
  return rope<true>(dtype, dout, cos, sin, dx, batch, seq, heads, d, cos_batch, stream);
}

}  // namespace fsdp::ops::cuda
