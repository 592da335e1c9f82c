// The CUDA kernels behind fsdp/ops/float8.h's dynamic casts, as plain launchers (no ATen). A
// tensorwise cast written in ATen ops is six kernels and three tensor-sized float32
// intermediates (abs, max, float32 copy, multiply, clamp, cast), and the GEMMs' transposed
// operands are more copies; here it is two passes over the input (its largest magnitude, then
// the cast), writing the row-major result, its transpose, or both at once.
//
// The arithmetic is torchao's (float8.h), so a kernel's bytes equal the ATen path's: the scale
// float32(fmt_max * (1 / max(double(amax), 1e-12))) in float64, each element float32(x) * scale
// in float32, clamped to +-fmt_max, rounded to nearest even; NaN stays NaN. Each launcher
// queues on `stream` and returns the launch's error (cudaSuccess when queued).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "fused_kernels.h"

namespace fsdp::ops::cuda {

enum class Float8Format { kE4M3, kE5M2 };

// *amax = max |x| over numel elements of x (float32; NaN when any element is NaN, 0 for none).
cudaError_t abs_max(DType dtype, const void* x, int64_t numel, float* amax, cudaStream_t stream);

// Casts x [rows, cols] (contiguous) to float8 (one byte per element). The scale comes from
// *amax when amax is not null (and is written to *scale), else it is *scale. `out` (row-major
// [rows, cols]) and `out_t` (the transpose, [cols, ld_t] row-major with ld_t >= rows; columns
// rows to ld_t are left as they are) may each be null.
cudaError_t float8_cast(DType dtype, Float8Format format, const void* x, int64_t rows, int64_t cols,
                        const float* amax, float* scale, void* out, void* out_t, int64_t ld_t,
                        cudaStream_t stream);

// The axiswise cast of torchao's rowwise recipe (float8.h's to_float8_rowwise): x [rows, cols]
// (contiguous) with one scale per row (axis 1: each row's largest magnitude over its columns)
// or per column (axis 0: over the rows), each torchao's scale of its amax (as above) rounded
// down to a power of 2 as ATen's exp2(floor(log2(scale))) in float32 rounds it; out row-major
// [rows, cols], scale float32 [rows] or [cols]. A NaN in a slice makes its scale and all of its
// elements NaN, as the ATen ops do. Per row: one pass (a block per row); per column: the
// columns' amaxes (atomics into `scale`), their scales, then the cast.
cudaError_t float8_cast_axiswise(DType dtype, Float8Format format, const void* x, int64_t rows,
                                 int64_t cols, int axis, float* scale, void* out,
                                 cudaStream_t stream);

}  // namespace fsdp::ops::cuda
