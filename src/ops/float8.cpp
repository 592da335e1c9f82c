#include "fsdp/ops/float8.h"

#include <fmt/format.h>
#include <torch/autograd.h>

#include "util/check.h"

namespace fsdp::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

double float8_max(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0;  // torch.finfo(...).max
}

// torchao's is_row_major: the stride of rows above that of columns.
bool row_major(const at::Tensor& t) { return t.stride(0) > t.stride(1); }

// The three GEMMs of a linear (float8.h), on x [m, in] and weight [out, in].
class Float8Matmul : public torch::autograd::Function<Float8Matmul> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight) {
    ctx->save_for_backward({x, weight});
    const auto x8 = to_float8(x, at::kFloat8_e4m3fn);
    const auto w8 = to_float8(weight, at::kFloat8_e4m3fn);
    return float8_mm(x8, {w8.data.t(), w8.scale}, x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& weight = saved[1];
    const auto& dy = grad_outputs[0];
    // dy's cast serves both GEMMs: torchao's two casts of it use the same config.
    const auto dy8 = to_float8(dy, at::kFloat8_e5m2);
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = float8_mm(dy8, to_float8(weight, at::kFloat8_e4m3fn), dy.scalar_type());
    }
    if (ctx->needs_input_grad(1)) {
      dw = float8_mm({dy8.data.t(), dy8.scale}, to_float8(x, at::kFloat8_e4m3fn), dy.scalar_type());
    }
    return {dx, dw};
  }
};

}  // namespace

Float8Tensor to_float8(const at::Tensor& t, at::ScalarType dtype) {
  FSDP_CHECK_ARG(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
                 "to_float8: the target must be float8_e4m3fn or float8_e5m2, got {}",
                 c10::toString(dtype));
  FSDP_CHECK_ARG(at::isFloatingType(t.scalar_type()) && t.numel() > 0,
                 "to_float8: expected a non-empty floating tensor, got {} of {} elements",
                 c10::toString(t.scalar_type()), t.numel());
  const double max = float8_max(dtype);
  // torchao's amax_to_scale: in float64 (Python's `max / amax` is amax.reciprocal() * max),
  // then float32.
  const auto amax = t.abs().max().to(at::kDouble).clamp_min(1e-12);
  auto scale = amax.reciprocal().mul(max).to(at::kFloat);
  // _ToFloat8ConstrFunc and to_fp8_saturated: scaled in float32, saturated, cast.
  auto data = (t.to(at::kFloat) * scale).clamp_(-max, max).to(dtype);
  return {std::move(data), std::move(scale)};
}

at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype) {
  FSDP_CHECK_ARG(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(0),
                 "float8_mm: expected [m, k] @ [k, n], got {} @ {}", a.data.sizes(),
                 b.data.sizes());
  // torchao's preprocess_addmm: _scaled_mm takes a row-major and b column-major.
  auto a_data = row_major(a.data) ? a.data : a.data.contiguous();
  auto b_data = row_major(b.data) ? b.data.t().contiguous().t() : b.data;
  // The forward's GEMM with fast accumulation (torchao's gemm_config_output), as the CPU
  // ignores it and Hopper's float8 GEMMs gain from it; the backward's without.
  const bool fast_accum = a.data.scalar_type() == at::kFloat8_e4m3fn;
  return at::_scaled_mm(a_data, b_data, a.scale.reciprocal(), b.scale.reciprocal(),
                        /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, out_dtype,
                        fast_accum);
}

std::string float8_linear_unsupported(int64_t in, int64_t out) {
  if (in % 16 == 0 && out % 16 == 0) return {};
  return fmt::format(
      "a Linear of {} inputs and {} outputs: float8 GEMMs need both to be "
      "multiples of 16",
      in, out);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  FSDP_CHECK_ARG(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
                 "float8_linear: expected x [..., in] and weight [out, in], got {} and {}",
                 x.sizes(), weight.sizes());
  FSDP_CHECK_ARG(x.scalar_type() == weight.scalar_type() && at::isFloatingType(x.scalar_type()),
                 "float8_linear: x and weight must share a floating dtype, got {} and {}",
                 c10::toString(x.scalar_type()), c10::toString(weight.scalar_type()));
  const auto why = float8_linear_unsupported(weight.size(1), weight.size(0));
  FSDP_CHECK_ARG(why.empty(), "float8_linear: {}", why);
  FSDP_CHECK_ARG(!bias.defined() || (bias.dim() == 1 && bias.size(0) == weight.size(0)),
                 "float8_linear: expected bias [{}], got {}", weight.size(0), bias.sizes());
  auto out_shape = x.sizes().vec();
  out_shape.back() = weight.size(0);
  auto y = Float8Matmul::apply(x.reshape({-1, x.size(-1)}), weight).reshape(out_shape);
  // Float8Linear.forward: the bias added after the GEMM, in the output's dtype.
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace fsdp::ops
