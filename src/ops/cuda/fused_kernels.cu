// fused_kernels.h: RMSNorm (one block per row, a warp-shuffle reduction) and SwiGLU (a
// grid-stride elementwise loop), forward and backward, for float, bfloat16 and half.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "dtype.cuh"
#include "fused_kernels.h"

namespace fsdp::ops::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks of the RMSNorm backward: each sums its rows' weight-gradient parts into its own row of
// the workspace, which a second kernel sums over the blocks.
constexpr int64_t kBackwardBlocks = 256;

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

template <typename T>
__global__ void rms_norm_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                        T* __restrict__ y, float* __restrict__ rstd, int64_t n,
                                        int64_t d, float eps) {
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {  // uniform over the block
    const T* xr = x + row * d;
    T* yr = y + row * d;
    float sumsq = 0;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float v = to_f(xr[i]);
      sumsq += v * v;
    }
    const float r = rsqrtf(block_sum(sumsq) / static_cast<float>(d) + eps);
    if (threadIdx.x == 0) rstd[row] = r;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      // LlamaRMSNorm: the normalised value cast to the input's dtype, then times the weight.
      yr[i] = from_f<T>(to_f(w[i]) * round_to<T>(to_f(xr[i]) * r));
    }
  }
}

template <typename T>
__global__ void rms_norm_backward_kernel(const T* __restrict__ dy, const T* __restrict__ x,
                                         const T* __restrict__ w, const float* __restrict__ rstd,
                                         T* __restrict__ dx, float* __restrict__ partial_dw,
                                         int64_t n, int64_t d) {
  float* my_dw = partial_dw + blockIdx.x * d;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) my_dw[i] = 0;
  for (int64_t row = blockIdx.x; row < n; row += gridDim.x) {
    const T* dyr = dy + row * d;
    const T* xr = x + row * d;
    T* dxr = dx + row * d;
    const float r = rstd[row];
    // d(loss)/d(normalised) = dy * w in the dtype (the twin's product), then float32.
    float dot = 0;
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float g = round_to<T>(to_f(dyr[i]) * to_f(w[i]));
      dot += g * to_f(xr[i]) * r;
    }
    dot = block_sum(dot) / static_cast<float>(d);
    for (int64_t i = threadIdx.x; i < d; i += kThreads) {
      const float h = to_f(xr[i]) * r;
      const float g = round_to<T>(to_f(dyr[i]) * to_f(w[i]));
      dxr[i] = from_f<T>(r * (g - h * dot));
      my_dw[i] += to_f(dyr[i]) * round_to<T>(h);
    }
  }
}

__global__ void sum_blocks_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                  int64_t blocks, int64_t d) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= d) return;
  float s = 0;
  for (int64_t b = 0; b < blocks; ++b) s += partial[b * d + i];
  out[i] = s;
}

__device__ __forceinline__ float sigmoid(float g) { return 1.0f / (1.0f + __expf(-g)); }

template <typename T>
__global__ void swiglu_forward_kernel(const T* __restrict__ gate, const T* __restrict__ up,
                                      T* __restrict__ out, int64_t numel) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]);
    // silu(gate) is a tensor of the dtype in the twin, then times up.
    out[i] = from_f<T>(round_to<T>(g * sigmoid(g)) * to_f(up[i]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* __restrict__ dout, const T* __restrict__ gate,
                                       const T* __restrict__ up, T* __restrict__ dgate,
                                       T* __restrict__ dup, int64_t numel) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < numel;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_f(gate[i]), u = to_f(up[i]), go = to_f(dout[i]);
    const float s = sigmoid(g);
    const float a = round_to<T>(g * s);    // silu(gate) in the dtype
    const float da = round_to<T>(go * u);  // the product's gradient to silu(gate)
    dup[i] = from_f<T>(go * a);
    dgate[i] = from_f<T>(da * s * (1.0f + g * (1.0f - s)));
  }
}

int64_t elementwise_blocks(int64_t numel) {
  return std::max<int64_t>(1, std::min<int64_t>((numel + kThreads - 1) / kThreads, 65535));
}

}  // namespace

int64_t rms_norm_workspace_floats(int64_t n, int64_t d) {
  return std::min<int64_t>(std::max<int64_t>(n, 1), kBackwardBlocks) * d;
}

cudaError_t rms_norm_forward(DType dtype, const void* x, const void* weight, void* y, float* rstd,
                             int64_t n, int64_t d, float eps, cudaStream_t stream) {
  if (n == 0 || d == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(n, int64_t{1} << 20));
    rms_norm_forward_kernel<T>
        <<<blocks, kThreads, 0, stream>>>(static_cast<const T*>(x), static_cast<const T*>(weight),
                                          static_cast<T*>(y), rstd, n, d, eps);
  });
}

cudaError_t rms_norm_backward(DType dtype, const void* dy, const void* x, const void* weight,
                              const float* rstd, void* dx, float* dweight, float* workspace,
                              int64_t n, int64_t d, cudaStream_t stream) {
  if (d == 0) return cudaSuccess;
  const int64_t blocks = std::min<int64_t>(std::max<int64_t>(n, 1), kBackwardBlocks);
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    rms_norm_backward_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), static_cast<const T*>(x), static_cast<const T*>(weight), rstd,
        static_cast<T*>(dx), workspace, n, d);
    sum_blocks_kernel<<<static_cast<unsigned>((d + kThreads - 1) / kThreads), kThreads, 0,
                        stream>>>(workspace, dweight, blocks, d);
  });
}

cudaError_t swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t numel,
                           cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    swiglu_forward_kernel<T>
        <<<static_cast<unsigned>(elementwise_blocks(numel)), kThreads, 0, stream>>>(
            static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(out), numel);
  });
}

cudaError_t swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up,
                            void* dgate, void* dup, int64_t numel, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    swiglu_backward_kernel<T>
        <<<static_cast<unsigned>(elementwise_blocks(numel)), kThreads, 0, stream>>>(
            static_cast<const T*>(dout), static_cast<const T*>(gate), static_cast<const T*>(up),
            static_cast<T*>(dgate), static_cast<T*>(dup), numel);
  });
}

}  // namespace fsdp::ops::cuda
