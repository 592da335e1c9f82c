// One chunk of ops::linear_cross_entropy after its logits' GEMM: the chunk's softmax
// cross-entropy and the gradient of its logits, and the chunk's part of the weight's gradient.
// Each has an ATen form (the CPU's, and the GPU's without the kernels) and a GPU form: the
// cross-entropy kernel of ops/cuda/cross_entropy_kernels.h, in place over the logits, and the
// weight's part accumulated by cuBLAS straight into the float32 sum.
#pragma once

#include <ATen/ATen.h>

namespace fsdp::ops::detail {

// A chunk's rows as the loss needs them ([rows] each, on the logits' device): the target's
// column in this rank's slice of the vocabulary (clamped into it), whether this rank holds the
// target (`here`), whether the target is counted (not the ignore index), 1 / the number of
// counted targets of the whole batch (a float32 scalar), and, only when the vocabulary is split
// over ranks, each row's log-sum-exp and target logit over the whole vocabulary (float32).
struct ChunkRows {
  at::Tensor index, here, counted, inv_count, lse, target;
};

// The chunk's loss, summed over its counted rows (a float32 scalar), and with want_grad
// d loss / d logits in the logits' dtype: (softmax - one-hot where here) * inv_count on counted
// rows, zero on the others.
struct ChunkLoss {
  at::Tensor loss_sum, grad;
};

// Whether chunk_cross_entropy runs the kernel for these logits (a CUDA tensor of a kernel dtype
// with the kernels built, enabled and loadable; see ops/cuda_dispatch.h).
bool chunk_kernel_runs_on(const at::Tensor& logits);

// logits [rows, vocab] in hidden's dtype, as the GEMM gave them, and given up by the caller:
// the ATen form computes in a float32 copy, but the kernel, when the gradient is wanted,
// overwrites `logits` with it and returns that as `grad`. The kernel leaves a row that is not
// counted unread (loss 0, gradient zeros, even where its logits are not finite). The two agree
// to float32 summation order.
ChunkLoss chunk_cross_entropy(const at::Tensor& logits, const ChunkRows& rows, bool want_grad);

// grad_w (float32 [vocab, hidden]) += grad^T @ hidden (grad [rows, vocab], hidden [rows,
// hidden], one dtype). In float32: in place. In bf16 or half: the product rounded once to that
// dtype and added; on a GPU with the kernels, cuBLAS adds the product to grad_w in float32
// directly (no rounding, no [vocab, hidden] temporary).
void accumulate_weight_grad(at::Tensor& grad_w, const at::Tensor& grad, const at::Tensor& hidden);

}  // namespace fsdp::ops::detail
