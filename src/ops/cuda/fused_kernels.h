// The CUDA kernels behind fsdp/ops/fused.h, as plain launchers (no ATen: nvcc compiles this
// folder alone, quickly). Each works on contiguous rows in the caller's dtype, computes in
// float32 and rounds where the ATen twin rounds (fused.h), and queues on `stream`. Returns the
// launch's error (cudaSuccess when queued).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fsdp::ops::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

// y = weight * cast(x * rstd) for n rows of d elements, rstd[row] = rsqrt(mean(x^2) + eps).
cudaError_t rms_norm_forward(DType dtype, const void* x, const void* weight, void* y, float* rstd,
                             int64_t n, int64_t d, float eps, cudaStream_t stream);
// The residual add and the norm in one pass: h = cast(x + y) (written), then out, rstd of h as
// rms_norm_forward's; its backward is rms_norm_backward's on h.
cudaError_t add_rms_norm_forward(DType dtype, const void* x, const void* y, void* h,
                                 const void* weight, void* out, float* rstd, int64_t n, int64_t d,
                                 float eps, cudaStream_t stream);
// dx (the dtype) and dweight (float32, d elements, written: the sum over rows); `workspace`
// holds rms_norm_workspace_floats(n, d) floats, on a 16-byte boundary (else every access of the
// call, dy, x and dx too, goes one element at a time). dweight null: no weight gradient (a
// frozen weight), and no workspace is touched.
cudaError_t rms_norm_backward(DType dtype, const void* dy, const void* x, const void* weight,
                              const float* rstd, void* dx, float* dweight, float* workspace,
                              int64_t n, int64_t d, cudaStream_t stream);
int64_t rms_norm_workspace_floats(int64_t n, int64_t d);

// out = cast(silu(gate)) * up over numel elements, and its backward.
cudaError_t swiglu_forward(DType dtype, const void* gate, const void* up, void* out, int64_t numel,
                           cudaStream_t stream);
cudaError_t swiglu_backward(DType dtype, const void* dout, const void* gate, const void* up,
                            void* dgate, void* dup, int64_t numel, cudaStream_t stream);

// Rotary embeddings (transformers' apply_rotary_pos_emb on one tensor): out = x * c +
// rotate_half(x) * s, each product and the sum rounded to the dtype as the twin's three ops
// round. x and out are [batch, seq, heads, d] contiguous (d even); cos and sin [cos_batch, seq,
// d] contiguous, cos_batch 1 (every batch element's positions the same) or batch.
cudaError_t rope_forward(DType dtype, const void* x, const void* cos, const void* sin, void* out,
                         int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t cos_batch,
                         cudaStream_t stream);
// dx from dout, the same layouts: dx = dout * c + rotate_half^T(dout * s), with the roundings
// of the twin's backward (its two products, then their sum).
cudaError_t rope_backward(DType dtype, const void* dout, const void* cos, const void* sin, void* dx,
                          int64_t batch, int64_t seq, int64_t heads, int64_t d, int64_t cos_batch,
                          cudaStream_t stream);

}  // namespace fsdp::ops::cuda
