// cross_entropy_kernels.h: one block per row (a grid-stride loop over the rows), each thread a
// strided run of 16-byte packs of the row (single elements when the vocabulary does not divide
// into packs), an online max-and-sum per thread merged over the block, then a second pass that
// writes the gradient over the logits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cross_entropy_kernels.h"
#include "dtype.cuh"

namespace fsdp::ops::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 18;

// A running softmax denominator: every value seen is <= m, and s = sum(exp(value - m)).
struct MaxSum {
  float m, s;
};

// The larger of a and b, NaN if either is (fmaxf drops a NaN; ATen's amax keeps it).
__device__ __forceinline__ float max_nan(float a, float b) {
  return a != a ? a : (b != b ? b : fmaxf(a, b));
}

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = max_nan(a.m, b.m);
  if (m == -INFINITY) return {m, a.s + b.s};  // neither has seen a value yet
  return {m, a.s * expf(a.m - m) + b.s * expf(b.m - m)};
}

// The merge over the block: each warp's lane 0 result, merged in the same order by every
// thread (so all get the same bits).
__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ float ms[kThreads / 32], ss[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) {
    v = merge(v, {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    ms[warp] = v.m;
    ss[warp] = v.s;
  }
  __syncthreads();
  MaxSum total{ms[0], ss[0]};
  for (int w = 1; w < kThreads / 32; ++w) total = merge(total, {ms[w], ss[w]});
  __syncthreads();  // ms and ss are reused by the next row
  return total;
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(T* __restrict__ logits, int64_t rows, int64_t vocab,
                              const int64_t* __restrict__ index, const bool* __restrict__ here,
                              const bool* __restrict__ counted, const float* __restrict__ inv_count,
                              const float* __restrict__ lse_in, const float* __restrict__ target_in,
                              float* __restrict__ loss, bool grad) {
  using P = Pack<T, N>;
  const int64_t packs = vocab / N;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {  // uniform over the block
    P* r = reinterpret_cast<P*>(logits + row * vocab);
    if (!counted[row]) {
      if (threadIdx.x == 0) loss[row] = 0.0f;
      if (grad) {
        P zero;
        for (int j = 0; j < N; ++j) zero.v[j] = from_f<T>(0.0f);
        for (int64_t i = threadIdx.x; i < packs; i += kThreads) r[i] = zero;
      }
      continue;
    }
    const int64_t col = index[row];
    float lse, target;
    if (lse_in != nullptr) {
      lse = lse_in[row];
      target = target_in[row];
    } else {
      // Read before the block's merge, a barrier that no thread passes before all have read it:
      // the gradient pass below overwrites the row.
      target = to_f(logits[row * vocab + col]);
      MaxSum acc{-INFINITY, 0.0f};
      for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
        const P p = r[i];
        float pack_max = -INFINITY;
        for (int j = 0; j < N; ++j) pack_max = max_nan(pack_max, to_f(p.v[j]));
        const float m = max_nan(acc.m, pack_max);
        // Nothing but -inf so far: every exp() is 0 (and -inf - -inf would be NaN).
        if (m == -INFINITY) continue;
        float s = acc.m == m ? acc.s : acc.s * expf(acc.m - m);
        for (int j = 0; j < N; ++j) s += expf(to_f(p.v[j]) - m);
        acc = {m, s};
      }
      acc = block_max_sum(acc);
      // ATen's logsumexp: log of the sum relative to the maximum, then the maximum added.
      lse = logf(acc.s) + acc.m;
    }
    if (threadIdx.x == 0) loss[row] = lse - target;
    if (!grad) continue;
    const bool hit = here[row];
    const float scale = *inv_count;
    for (int64_t i = threadIdx.x; i < packs; i += kThreads) {
      P p = r[i];
      for (int j = 0; j < N; ++j) {
        // The twin's order: exp(logit - lse), the one-hot subtracted, then the scale.
        float g = expf(to_f(p.v[j]) - lse);
        if (hit && i * N + j == col) g = g - 1.0f;
        p.v[j] = from_f<T>(g * scale);
      }
      r[i] = p;
    }
  }
}

}  // namespace

cudaError_t cross_entropy_rows(DType dtype, void* logits, int64_t rows, int64_t vocab,
                               const int64_t* index, const bool* here, const bool* counted,
                               const float* inv_count, const float* lse_in, const float* target_in,
                               float* loss, bool grad, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  if (vocab <= 0 || (lse_in == nullptr) != (target_in == nullptr)) return cudaErrorInvalidValue;
  const auto blocks = static_cast<unsigned>(strided_blocks(rows, kMaxBlocks));
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    auto* p = static_cast<T*>(logits);
    by_pack<T>(
        vocab,
        [&](auto n) {
          launch(cross_entropy_rows_kernel<T, decltype(n)::value>, blocks, kThreads, 0, stream, p,
                 rows, vocab, index, here, counted, inv_count, lse_in, target_in, loss, grad);
        },
        p);
  });
}

}  // namespace fsdp::ops::cuda
