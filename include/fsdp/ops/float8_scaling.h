// The scaling of float8 training's casts (fsdp/ops/float8.h), alone so that option parsers and
// model options name it without ATen's headers.
#pragma once

namespace fsdp::ops {

// torchao's Float8Linear recipes: "tensorwise" (its default: one scale per tensor, the gradient
// in e5m2) and "rowwise" (one scale per row of each GEMM operand along the GEMM's inner
// dimension, rounded down to a power of 2; every operand e4m3, the gradient too; more accurate
// where rows differ in magnitude, and on Hopper a slower GEMM).
enum class Float8Scaling { tensorwise, rowwise };

}  // namespace fsdp::ops
