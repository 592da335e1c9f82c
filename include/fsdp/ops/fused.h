// Fused elementwise operations of the Llama block, each one kernel forward and one backward on
// a GPU when the CUDA kernels are built (FSDP_WITH_CUDA_KERNELS; cuda_kernels_built() says),
// and its ATen twin elsewhere (the CPU, a libtorch or build without them, mixed dtypes). The
// twin is the unfused formula transformers' Llama computes, op for op; the kernel computes the
// same in float32 with the twin's roundings to the tensors' dtype (so fp32 agrees to float
// rounding, bf16 within the rounding of the values it stores), where ATen runs several
// kernels and keeps their intermediates for the backward.
#pragma once

#include <ATen/ATen.h>

#include <utility>

namespace fsdp::ops {

// LlamaRMSNorm: weight * cast(x32 * rsqrt(mean(x32^2, -1) + eps)) with x32 = float32(x) and
// cast back to x's dtype before the weight: x [..., d], weight [d]. The kernel keeps one float
// per row (its rsqrt) for the backward instead of the twin's float32 copies of x, and sums the
// weight's gradient over rows in float32 without rounding each row's product to the dtype as
// the twin does (more exact, not bit-equal). Kernels on GPUs of compute capability 8.0 or
// newer (built for sm_80 and sm_90, with PTX); older ones run the twin.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// The residual add and the norm after it (a Llama layer's h = x + attention, then
// post_attention_layernorm(h)): {h, rms_norm(h, weight, eps)}, h = x + y in their dtype (x and
// y of one shape and dtype: no broadcasting or promotion, unlike operator+). On a
// GPU one kernel reads x and y once and writes h and the norm (rms_norm's numbers, on h); its
// backward is rms_norm's kernel plus the add of h's other gradient.
std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& y,
                                               const at::Tensor& weight, double eps);

// Whether fsdp's CUDA kernels run on `t`: a CUDA tensor of float32, bf16 or half on a GPU they
// are built for, in a build with them, FSDP_CUDA_KERNELS not 0. A model asks it to choose its GPU
// path (MiniLLM's batch-first attention), so that FSDP_CUDA_KERNELS=0 gives the plain one.
bool cuda_kernels_run_on(const at::Tensor& t);

// Whether rms_norm and add_rms_norm run the kernel on these tensors (x on a GPU the kernels
// run on, in a kernel dtype, weight of x's device and dtype, x not empty; FSDP_CUDA_KERNELS not
// 0), rather than the twin. A model whose own norm is another formula (MiniLLM's
// torch::rms_norm) asks it to take the kernel where it runs and keep its own elsewhere.
bool rms_norm_uses_kernel(const at::Tensor& x, const at::Tensor& weight);

// SwiGLU's product: cast(silu(gate)) * up, gate and up of one shape and dtype. The kernel keeps
// gate and up for the backward (the twin also keeps silu(gate)).
at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up);

// Rotary position embeddings on one tensor, transformers' apply_rotary_pos_emb (unsqueeze_dim
// 1): x * c + rotate_half(x) * s with c, s = cos, sin unsqueezed over the heads and
// rotate_half(x) = (-x2, x1), the two halves of the last dimension. x [batch, heads, seq, d]
// (any strides; the kernel is fastest on the usual view of a [batch, seq, heads, d] projection),
// cos and sin [1 or batch, seq, d] of x's dtype. Differentiable in x (cos and sin are constants
// to the kernel: given ones that require a gradient, the twin runs). The kernel rounds where the
// twin's ops round (each product, then the sum): the same values, bit for bit. It
// keeps cos and sin for the backward, one kernel each way; the twin runs about five ATen ops
// each way.
at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Whether this build has the CUDA kernels (nvcc, sm_80 and sm_90, and PTX). FSDP_CUDA_KERNELS=0
// in the environment turns them off for a process (these ops and float8's casts then run their
// ATen twins on a GPU too).
bool cuda_kernels_built();

}  // namespace fsdp::ops
