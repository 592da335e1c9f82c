// Internal helpers shared by the CPU backends for dtype handling in collectives.
#pragma once

#include <ATen/ATen.h>

#include "fsdp/comm/process_group.h"

namespace fsdp::detail {

// True for dtypes whose sums an engine would round at every step (bfloat16, float16).
inline bool accumulates_in_fp32(at::ScalarType t) { return t == at::kBFloat16 || t == at::kHalf; }

// The buffer an engine reduces: a float32 copy for bfloat16/float16 (engines either lack these
// types or sum them with per-hop rounding), otherwise `t` itself.
inline at::Tensor accumulation_buffer(const at::Tensor& t) {
  return accumulates_in_fp32(t.scalar_type()) ? t.to(at::kFloat) : t;
}

// part(0) + part(1) + ... + part(world - 1), summed in this order (deterministic: the same bits
// on every backend that uses it and in a single process adding the same contributions), in
// float32 for bfloat16/float16 parts. The result is a new tensor, never a view of part(0).
template <typename Part>
at::Tensor sum_in_rank_order(int world, Part part) {
  auto first = part(0);
  auto acc = accumulates_in_fp32(first.scalar_type()) ? at::kFloat : first.scalar_type();
  auto sum = first.to(acc, /*non_blocking=*/false, /*copy=*/true);
  for (int r = 1; r < world; ++r) sum.add_(part(r));
  return sum;
}

// Stores the engine's sum `reduced` into `dst`, dividing by `world` for kAvg. Division happens
// in the accumulation dtype, before any rounding to dst's dtype.
inline void finish_reduction(const at::Tensor& dst, const at::Tensor& reduced, ReduceOp op,
                             int world) {
  if (op == ReduceOp::kAvg) reduced.div_(world);
  if (!reduced.is_same(dst)) dst.copy_(reduced);
}

// A same-bytes view for operations that only move bytes (gather, broadcast): bfloat16 as
// float16, which every engine moves (MPI has no bfloat16 type).
inline at::Tensor as_bits(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

}  // namespace fsdp::detail
