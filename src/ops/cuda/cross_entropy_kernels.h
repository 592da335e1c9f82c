// The softmax cross-entropy of ops::linear_cross_entropy's chunks as one CUDA kernel (what
// Liger-Kernel's cross-entropy kernel does in Triton): a chunk's logits are read once for each
// row's log-sum-exp (an online max and sum in float32) and once more to overwrite them in place
// with the gradient of the loss, instead of the ATen twin's float32 copy, logsumexp, exp,
// scatter, scale and cast back (about ten passes over [tokens, vocabulary] and two float32
// temporaries of that size). Plain launcher, no ATen, like fused_kernels.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fused_kernels.h"  // DType

namespace fsdp::ops::cuda {

// For each of `rows` rows of `logits` ([rows, vocab] contiguous, the dtype), on `stream`:
// - a row not counted (counted[row] false: an ignored target) gets loss 0 and, with `grad`, a
//   gradient of zeros; its logits are not read (as Liger-Kernel's kernel);
// - a counted row: lse = max + log(sum(exp(logit - max))) in float32 and the target's logit
//   logits[row, index[row]], or, when the vocabulary is split over ranks, both given in lse_in
//   and target_in (float32 [rows]; null otherwise); loss[row] = lse - target (float32);
// - with `grad`, the counted row is overwritten by d loss / d logits:
//   (exp(logit - lse) - 1 at column index[row] where here[row]) * inv_count[0], computed in
//   float32 in that order (the twin's) and rounded once to the dtype.
// index, here and counted are [rows] (int64, bool, bool); inv_count one float on the device
// (1 / the number of counted targets of the whole batch). Non-finite logits of a counted row:
// NaN and -inf as the twin (a NaN anywhere makes the row's loss and gradient NaN; -inf is a
// probability of 0); +inf gives NaN where the twin gives an infinite loss.
cudaError_t cross_entropy_rows(DType dtype, void* logits, int64_t rows, int64_t vocab,
                               const int64_t* index, const bool* here, const bool* counted,
                               const float* inv_count, const float* lse_in, const float* target_in,
                               float* loss, bool grad, cudaStream_t stream);

}  // namespace fsdp::ops::cuda
