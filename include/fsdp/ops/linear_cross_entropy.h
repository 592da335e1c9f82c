// The output layer and the cross-entropy loss in one (Liger-Kernel's fused linear cross-entropy,
// in ATen): cross_entropy(hidden @ weight^T, targets) without the [tokens, vocabulary] logits.
//
// The tokens go through in chunks: a chunk's logits are computed, turned into its loss and the
// gradient of that loss with respect to them (softmax minus the one-hot target), which gives
// the chunk's rows of the hidden states' gradient and its part of the weight's gradient at once;
// then the chunk's logits are dropped. The gradients are made during the forward and kept for
// the backward (as Liger-Kernel does), so the largest transient is one chunk's logits in fp32,
// where the unfused loss holds every token's logits and their gradient. At Llama 3's vocabulary
// of 128,256 and 8,192 tokens that is 4 GiB each in fp32 against 256 MiB for a chunk of 512.
//
// The arithmetic is the unfused path's: the chunk's logits in hidden's dtype (a bf16 GEMM under
// bf16 compute), their softmax in fp32, the gradient of the logits in fp32 scaled by 1 / count
// before it is cast back to hidden's dtype for the two GEMMs. Equal to the unfused loss and
// gradients in fp32 up to summation order; the weight's gradient sums the chunks' parts in fp32.
//
// On a GPU with this build's CUDA kernels (ops/fused.h's cuda_kernels_built, not turned off by
// FSDP_CUDA_KERNELS=0), a chunk's softmax, loss and gradient are one kernel over its logits,
// which it overwrites with their gradient (two passes instead of about ten, and no float32
// copies); a row whose target is ignored is not read. In bf16 or half, cuBLAS adds each chunk's
// weight-gradient product to the float32 sum directly, where the CPU rounds it to the dtype
// first. Both agree with the CPU's form to float32 summation order and that rounding.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "fsdp/comm/process_group.h"

namespace fsdp::ops {

struct LinearCrossEntropyOptions {
  // Tokens per chunk; 0 picks Liger-Kernel's size, about tokens * hidden / vocab rows (a chunk's
  // logits about as large as the hidden states), but at least the rows 256 MiB of fp32 logits
  // hold (each chunk adds to the whole weight gradient: tiny chunks are slow), or of the
  // logits' dtype where the GPU's kernel needs no float32 copy; powers of two.
  int64_t chunk_tokens = 0;
  // Targets equal to this are not counted (transformers' labels of -100).
  int64_t ignore_index = -100;
  // Tensor parallelism (the vocabulary-parallel loss): `weight` holds rows [vocab_offset,
  // vocab_offset + weight.size(0)) of a vocabulary of `vocab` (tp::chunk_of's split), hidden is
  // the same on every rank of `tp`, and the loss is the full vocabulary's, the same on every
  // rank. Each rank returns its share of the hidden states' gradient (the column-parallel
  // input's backward sums them). Null: the whole vocabulary here.
  ProcessGroupPtr tp;
  int64_t vocab_offset = 0;
  int64_t vocab = 0;
};

// The mean over counted targets of -log softmax(hidden @ weight^T)[target]: hidden [N, d] (any
// floating dtype), weight [V, d] (hidden's dtype), targets [N] int64. Zero, with zero
// gradients, when no target is counted. Differentiable in hidden and weight (a frozen weight
// gets no gradient and costs no GEMM). Throws InvalidArgument for shapes, dtypes or a
// vocabulary split that do not match; a target outside the vocabulary that is not ignored is
// refused on the host, and by a device-side assert on a GPU (as cross_entropy's).
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets,
                                const LinearCrossEntropyOptions& options = {});

// The chunk length `options.chunk_tokens` resolves to for these sizes. `logit_bytes`: what a
// chunk's transient holds per logit for the automatic size's 256 MiB floor: 4 (the float32 logits
// of the ATen form, the default), or the dtype's size where the GPU's kernel works in place on
// the GEMM's logits (2 in bf16: chunks twice as long at the same bytes).
int64_t linear_cross_entropy_chunk(int64_t tokens, int64_t hidden, int64_t vocab,
                                   const LinearCrossEntropyOptions& options = {},
                                   int64_t logit_bytes = 4);

}  // namespace fsdp::ops
