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
// rounded. Like torchao, the backward keeps the high-precision x and W (not their float8 casts)
// and casts again: W is the unsharded parameter FSDP frees and gathers again for the backward,
// so keeping a float8 copy from the forward would hold every layer's weight at once.
//
// On a GPU with this build's CUDA kernels (fused.h's cuda_kernels_built()), each cast is two
// kernels, the largest magnitude and then the cast, which also writes the transposed operand a
// backward GEMM takes; they give the ATen ops' bytes and scale.
//
// Equal to torchao 0.18's Float8Linear on the CPU (tests/reference/hf_llama.py train --float8
// is the reference); on a GPU _scaled_mm needs sm_89 or newer, and the forward's GEMM uses
// fast accumulation there as torchao's does (the CPU has only one). The weight gradient's GEMM
// runs over the tokens, which a GPU's _scaled_mm wants in multiples of 16: its float8 operands
// get zero rows there (torchao's pad_inner_dim; the values do not change).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

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

// The GEMM a @ b of two float8 tensors (a [m, k], b [k, n], any layout: _scaled_mm's row-major
// a and column-major b are made here), accumulated in float32, returned in `out_dtype`.
at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype);

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
// The backward casts the weight with the forward's scale.
at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const at::Tensor& weight_scale = {});

// Why a Linear of `in` inputs and `out` outputs cannot run in float8, or empty when it can.
std::string float8_linear_unsupported(int64_t in, int64_t out);

}  // namespace fsdp::ops
