// The dynamic float8 cast of fsdp/ops/float8.h in the layouts the float8 GEMMs take, for the
// ops' own code (float8.cpp, float8_all_gather.cpp). On a GPU with this build's CUDA kernels it
// is two kernels whatever the layouts (ops/cuda/float8_kernels.h); elsewhere the ATen ops
// torchao's cast is written in, with the transpose copied after. Both give the same bytes. The
// same for the rowwise recipe's axiswise cast (cast_to_float8_axiswise).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace fsdp::ops::detail {

// torch.finfo(dtype).max of e4m3fn (448) or e5m2 (57344).
double float8_max(at::ScalarType dtype);

// The saturating cast at a given scale (torchao's _ToFloat8ConstrFunc and to_fp8_saturated):
// float32(t) * scale (any shape that broadcasts to t's: one scale, or one per row or column),
// clamped to +-float8_max, cast to `dtype`.
at::Tensor saturated_cast(const at::Tensor& t, const at::Tensor& scale, at::ScalarType dtype);

// max |t| as a 0-dim tensor on t's device, float32 (float64 for a float64 t); NaN when t holds
// one.
at::Tensor abs_max(const at::Tensor& t);

struct Float8Cast {
  at::Tensor row;    // t's cast, t's shape (row-major): when asked
  at::Tensor col;    // [padded, k]: the cast of a 2-D t [m, k] column-major, rows m to padded
                     // zero (padded: m rounded up to `pad_to`): when asked
  at::Tensor scale;  // float32, 0-dim: value = data / scale
};

// t cast to `dtype` (e4m3fn or e5m2) with `scale` (float32, one element), or t's own scale
// when `scale` is undefined. Throws InvalidArgument for an empty or non-floating t, for
// `col` with a t that is not 2-D, and when neither `row` nor `col` is asked for.
Float8Cast cast_to_float8(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& scale,
                          bool row, bool col, int64_t pad_to = 1);

// The rowwise recipe's axiswise cast (float8.h's to_float8_rowwise, whose arguments it takes
// checked: t 2-D and non-empty, dim 0 or 1): one scale per slice along `dim`, a power of 2. On
// a GPU with the kernels, ops/cuda/float8_kernels.h's float8_cast_axiswise (one pass per row, or
// three short ones per column); elsewhere torchao's ATen ops. Both give the same bytes.
struct Float8Axiswise {
  at::Tensor data;   // t's shape: row-major from the kernels, t's layout from the ATen ops
  at::Tensor scale;  // float32, [rows, 1] (dim 1) or [1, cols] (dim 0)
};
Float8Axiswise cast_to_float8_axiswise(const at::Tensor& t, at::ScalarType dtype, int64_t dim);

}  // namespace fsdp::ops::detail
