// float8 linears for training: torchao's Float8Linear recipe "tensorwise" (its default, and
// TorchTitan's --model.converters float8), in ATen, so a C++ program gets the same numbers.
//
// Each of a linear's three GEMMs runs in float8 through at::_scaled_mm, with a scale computed
// from the tensor it casts (dynamic scaling, one scale per tensor):
//   forward       y  = x  @ W^T      x: e4m3, W: e4m3
//   grad input    dx = dy @ W        dy: e5m2 (more range, less precision), W: e4m3
//   grad weight   dW = dy^T @ x      dy: e5m2, x: e4m3
// A tensor t is cast as torchao's hp_tensor_to_float8_dynamic does: amax = max |t| (in t's
// dtype), scale = float32(finfo(f8).max / max(amax, 1e-12)) computed in float64, data =
// saturate(float32(t) * scale) cast to f8; the GEMM multiplies by 1 / scale of each side and
// accumulates in float32, returning the input's dtype. The bias, the master weights, the
// gradients' dtype and the optimizer state are as without float8: only the GEMMs' operands are
// rounded. The backward keeps x's float8 cast for the weight's gradient (the transposed copy,
// written by the forward's cast pass: the bytes torchao's backward casts again) and none of x
// when the weight gets no gradient; it keeps the high-precision W and casts it again, as
// torchao: W is the unsharded parameter FSDP frees and gathers again for the backward, so
// keeping a float8 copy from the forward would hold every layer's weight at once. (Rowwise
// scaling keeps x, which its backward casts along another axis.)
//
// On a GPU with this build's CUDA kernels (fused.h's cuda_kernels_built()), each cast is two
// kernels, the largest magnitude and then the cast, which also writes the transposed operand a
// backward GEMM takes; they give the ATen ops' bytes and scale.
//
// Rowwise scaling (Float8Scaling, float8_scaling.h: torchao's recipe "rowwise") casts each GEMM's
// operands by rows along the GEMM's inner dimension instead: to_float8_rowwise, float8_linear's
// `scaling`.
//
// Equal to torchao 0.18's Float8Linear on the CPU (tests/reference/hf_llama.py train --float8
// is the reference); on a GPU _scaled_mm needs sm_89 or newer, and the forward's GEMM uses
// fast accumulation there as torchao's does (the CPU has only one). The weight gradient's GEMM
// runs over the tokens, which a GPU's _scaled_mm wants in multiples of 16: its float8 operands
// get zero rows there (torchao's pad_inner_dim; the values do not change).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/ops/float8_scaling.h"

namespace fsdp::ops {

// A float8 tensor with its scale: the value it stands for is data / scale.
struct Float8Tensor {
  at::Tensor data;   // at::kFloat8_e4m3fn or at::kFloat8_e5m2
  at::Tensor scale;  // float32, one element
};

// The dynamic tensorwise cast above: any floating `t`, `dtype` e4m3fn or e5m2. Zero stays zero
// (the amax is clamped to 1e-12); magnitudes the scale pushes past the format saturate.
Float8Tensor to_float8(const at::Tensor& t, at::ScalarType dtype);
// The scale to_float8 gives a tensor whose largest magnitude is `amax`: float32(finfo(dtype).max
// / max(amax, 1e-12)), computed in float64; elementwise over a floating tensor of any shape.
at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType dtype);
// The cast with a given `scale` (float32, one element) instead of the tensor's own.
Float8Tensor to_float8(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& scale);

// The rowwise cast: t [rows, cols] with one scale per slice along `dim` (torchao's axiswise cast,
// axiswise_dim = dim: the largest magnitude over `dim`, kept as a dimension of 1), each
// float8_scale of its slice's largest magnitude rounded down to a power of 2 (torchao's
// round_scales_to_power_of_2, which its rowwise recipe sets). dim 1 (or -1): a scale per row,
// [rows, 1]; dim 0: a scale per column, [1, cols].
Float8Tensor to_float8_rowwise(const at::Tensor& t, at::ScalarType dtype, int64_t dim);

// The GEMM a @ b of two float8 tensors (a [m, k], b [k, n], any layout: _scaled_mm's row-major
// a and column-major b are made here), accumulated in float32, returned in `out_dtype`. Scales
// of one element each (tensorwise), or a's [m, 1] and b's [1, n] (rowwise): on a GPU as
// torchao's addmm_float8_unwrapped runs them (without fast accumulation: the tensorwise kernel,
// then the scales; in bf16 for a float32 or float16 result), elsewhere as torchao's emulation
// (the dequantized operands multiplied in float32: _scaled_mm on the CPU takes tensorwise scales
// only). `fast_accum` (the GPU's fast float8 accumulation): by default for an e4m3 `a`, which
// for the tensorwise recipe is the forward's GEMM (torchao's gemm_config_output).
at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     std::optional<bool> fast_accum = std::nullopt);

// y = x @ weight^T + bias with the three GEMMs in float8 (above); x [..., in], weight [out, in]
// in x's dtype, bias [out] or undefined. Differentiable in x, weight and bias (a frozen weight
// costs no GEMM in the backward). Throws InvalidArgument when in or out is not a multiple of 16
// (_scaled_mm's requirement, which torchao's filters also apply), or on mismatched shapes and
// dtypes.
//
// `weight_scale`, when defined, is the scale a float8 all-gather cast the weight's shards with
// (fsdp/ops/float8_all_gather.h: the whole weight's, agreed over the ranks), the weight being
// their dequantization: the forward then casts with it, which gives back the gathered float8
// values exactly, as torchao's float8 all-gather hands its Float8 weight to the GEMM. It is
// used only where it is the weight's (its largest magnitude times the scale within 2^-7 of the
// format's maximum, checked on the device without a host sync), else the weight's own scale.
// The backward casts the weight with the forward's scale. Tensorwise scaling only.
//
// `scaling` rowwise: torchao's rowwise recipe (Float8Scaling above): x by rows and the weight by
// its output rows in the forward, the gradient by rows and the weight by its input columns for
// the input's gradient, the gradient and x by columns for the weight's.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const at::Tensor& weight_scale = {},
                         Float8Scaling scaling = Float8Scaling::tensorwise);

// Why a Linear of `in` inputs and `out` outputs cannot run in float8, or empty when it can.
std::string float8_linear_unsupported(int64_t in, int64_t out);

// Why float8 GEMMs of `scaling`'s recipe cannot run on `device`, or empty when they can, as
// torch._scaled_mm decides: the CPU runs both recipes (rowwise as torchao's emulation); a CUDA
// GPU runs tensorwise from compute capability 8.9 on (Ada, Hopper, Blackwell) and rowwise on
// 8.9, 9.x and 10.x only (its rowwise kernels leave out sm_110 and sm_120, the RTX 50 series).
// Any other device (MPS, XPU; a ROCm libtorch's GPUs are not considered) gets a message.
// float8_linear and float8_mm throw fsdp::UnsupportedError with it before any cast or GEMM; a
// program can ask first, before it builds a model for float8 (the trainers do, for --float8).
std::string float8_unsupported_on(const c10::Device& device,
                                  Float8Scaling scaling = Float8Scaling::tensorwise);

}  // namespace fsdp::ops
