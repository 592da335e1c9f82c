#include "fsdp/ops/float8.h"

#include <fmt/format.h>
#include <torch/autograd.h>

#include "fsdp/errors.h"
#include "ops/float8_cast.h"
#include "util/check.h"

#ifdef FSDP_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAContextLight.h>
#endif

namespace fsdp::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// torchao's is_row_major: the stride of rows above that of columns.
bool row_major(const at::Tensor& t) { return t.stride(0) > t.stride(1); }

// The three GEMMs of a linear (float8.h), on x [m, in] and weight [out, in].
class Float8Matmul : public torch::autograd::Function<Float8Matmul> {
 public:
  // The gathered scale travels outside the autograd inputs: an undefined one (none) is not a
  // variable autograd can describe.
  struct Scale {
    at::Tensor gathered;
    Float8Scaling scaling = Float8Scaling::tensorwise;
    bool weight_grad = true;  // a backward may want the weight's gradient (so x's cast)
  };
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const Scale& scale) {
    ctx->saved_data["rowwise"] = scale.scaling == Float8Scaling::rowwise;
    if (scale.scaling == Float8Scaling::rowwise) {
      ctx->save_for_backward({x, weight});
      // torchao's axiswise casts: x by rows, weight^T by columns (the weight's output rows).
      const auto x8 = to_float8_rowwise(x, at::kFloat8_e4m3fn, -1);
      const auto w8 = to_float8_rowwise(weight, at::kFloat8_e4m3fn, 1);
      return float8_mm(x8, {w8.data.t(), w8.scale.t()}, x.scalar_type(), /*fast_accum=*/true);
    }
    // x's transposed cast for the weight's gradient GEMM (tokens padded for a GPU's) is written
    // by the same pass as the forward's and kept instead of x: torchao casts x again in the
    // backward, to the same bytes (the same x, amax and scale), so this saves a read of x for
    // its amax and one for the cast, and keeps 1 byte an element instead of x's 2. Without a
    // weight gradient nothing of x is kept.
    const auto x8 = detail::cast_to_float8(x, at::kFloat8_e4m3fn, {}, /*row=*/true,
                                           /*col=*/scale.weight_grad, dw_token_padding(x));
    ctx->save_for_backward({scale.weight_grad ? x8.col : at::Tensor(), weight});
    ctx->saved_data["x_scale"] = x8.scale;
    const auto w_scale = weight_scale(weight, scale.gathered);
    const auto w8 = detail::cast_to_float8(weight, at::kFloat8_e4m3fn, w_scale, true, false);
    ctx->saved_data["w_scale"] = w_scale;
    return float8_mm({x8.row, x8.scale}, {w8.row.t(), w8.scale}, x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto& weight = saved[1];
    const auto& dy = grad_outputs[0];
    if (ctx->saved_data["rowwise"].toBool()) return rowwise_backward(ctx, saved[0], weight, dy);
    // dy's cast serves both GEMMs (torchao's two casts of it use the same config): row-major
    // for dx's, transposed for dw's, in one pass on a GPU.
    const bool need_dx = ctx->needs_input_grad(0), need_dw = ctx->needs_input_grad(1);
    const auto dy8 =
        detail::cast_to_float8(dy, at::kFloat8_e5m2, {}, need_dx, need_dw, dw_token_padding(dy));
    at::Tensor dx, dw;
    if (need_dx) {
      // W [out, in] as the GEMM's column-major right side: its transpose, cast in one pass.
      const auto w_scale = ctx->saved_data["w_scale"].toTensor();
      const auto w8 = detail::cast_to_float8(weight, at::kFloat8_e4m3fn, w_scale, false, true);
      dx = float8_mm({dy8.row, dy8.scale}, {w8.col, w8.scale}, dy.scalar_type());
    }
    if (need_dw) {
      const auto& x_col = saved[0];  // the forward's cast of x, transposed
      if (!x_col.defined()) {
        throw Error(
            "float8_linear: the weight's gradient was asked for but the forward kept no cast of "
            "x (the weight did not require a gradient, or grad mode was off, at the forward)");
      }
      dw = float8_mm({dy8.col.t(), dy8.scale}, {x_col, ctx->saved_data["x_scale"].toTensor()},
                     dy.scalar_type());
    }
    return {dx, dw, at::Tensor()};
  }

 private:
  // torchao's rowwise backward: every cast e4m3 and along the GEMM's inner dimension, so dy and
  // the weight are cast once per GEMM (dy by rows for dx, by columns for dW; the weight by its
  // input columns), x by columns; no fast accumulation. A GPU's weight-gradient GEMM gets the
  // tokens padded to 16 with zero rows, which change no column's largest magnitude.
  static variable_list rowwise_backward(AutogradContext* ctx, const at::Tensor& x,
                                        const at::Tensor& weight, const at::Tensor& dy) {
    constexpr auto e4m3 = at::kFloat8_e4m3fn;
    at::Tensor dx, dw;
    if (ctx->needs_input_grad(0)) {
      dx = float8_mm(to_float8_rowwise(dy, e4m3, -1), to_float8_rowwise(weight, e4m3, 0),
                     dy.scalar_type(), /*fast_accum=*/false);
    }
    if (ctx->needs_input_grad(1)) {
      // The padding added to the float8 casts (one byte an element), whose column scales zero
      // rows would not have changed.
      const int64_t m = x.size(0), pad = dy.is_cuda() ? (16 - m % 16) % 16 : 0;
      auto rows = [&](Float8Tensor t) {
        if (pad == 0) return t;
        auto padded = at::zeros({m + pad, t.data.size(1)}, t.data.options().dtype(at::kByte));
        padded.narrow(0, 0, m).copy_(t.data.view(at::kByte));
        t.data = padded.view(e4m3);
        return t;
      };
      const auto dy8 = rows(to_float8_rowwise(dy, e4m3, 0));
      dw = float8_mm({dy8.data.t(), dy8.scale.t()}, rows(to_float8_rowwise(x, e4m3, 0)),
                     dy.scalar_type(), /*fast_accum=*/false);
    }
    return {dx, dw, at::Tensor()};
  }

  // The tokens are the weight gradient's inner dimension, which a GPU's _scaled_mm wants a
  // multiple of 16 (torchao's pad_inner_dim): zero rows there add nothing. The CPU needs none,
  // and keeps torchao's exact GEMM.
  static int64_t dw_token_padding(const at::Tensor& t) { return t.is_cuda() ? 16 : 1; }

  // The gathered scale where it is the weight's (float8.h), else the weight's own; on the
  // device, without a host sync.
  static at::Tensor weight_scale(const at::Tensor& weight, const at::Tensor& gathered) {
    const auto amax = detail::abs_max(weight);
    auto own = float8_scale(amax, at::kFloat8_e4m3fn);
    if (!gathered.defined()) return own;
    const auto g = gathered.to(own.device(), at::kFloat).reshape({});
    const auto reach = amax * g / detail::float8_max(at::kFloat8_e4m3fn);
    return at::where((reach - 1).abs() <= 1.0 / 128, g, own);
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
  const auto c = detail::cast_to_float8(t, dtype, {}, /*row=*/true, /*col=*/false);
  return {c.row, c.scale};
}

at::Tensor float8_scale(const at::Tensor& amax, at::ScalarType dtype) {
  FSDP_CHECK_ARG(at::isFloatingType(amax.scalar_type()),
                 "float8_scale: expected floating amaxes, got {}",
                 c10::toString(amax.scalar_type()));
  // torchao's amax_to_scale: in float64 (Python's `max / amax` is amax.reciprocal() * max),
  // then float32.
  return amax.to(at::kDouble)
      .clamp_min(1e-12)
      .reciprocal()
      .mul(detail::float8_max(dtype))
      .to(at::kFloat);
}

Float8Tensor to_float8_rowwise(const at::Tensor& t, at::ScalarType dtype, int64_t dim) {
  FSDP_CHECK_ARG(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
                 "to_float8_rowwise: the target must be float8_e4m3fn or float8_e5m2, got {}",
                 c10::toString(dtype));
  FSDP_CHECK_ARG(
      at::isFloatingType(t.scalar_type()) && t.dim() == 2 && t.numel() > 0 && dim >= -2 && dim <= 1,
      "to_float8_rowwise: expected a non-empty floating 2-D tensor and one of its dimensions "
      "(0, 1, -1, -2), got {} of {} and dim {}",
      c10::toString(t.scalar_type()), t.sizes(), dim);
  auto c = detail::cast_to_float8_axiswise(t, dtype, dim < 0 ? dim + 2 : dim);
  return {std::move(c.data), std::move(c.scale)};
}

Float8Tensor to_float8(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& scale) {
  FSDP_CHECK_ARG(dtype == at::kFloat8_e4m3fn || dtype == at::kFloat8_e5m2,
                 "to_float8: the target must be float8_e4m3fn or float8_e5m2, got {}",
                 c10::toString(dtype));
  FSDP_CHECK_ARG(scale.numel() == 1 && scale.scalar_type() == at::kFloat,
                 "to_float8: expected a float32 scale of one element, got {} of {}", scale.numel(),
                 c10::toString(scale.scalar_type()));
  const auto c = detail::cast_to_float8(t, dtype, scale, /*row=*/true, /*col=*/false);
  return {c.row, c.scale};
}

std::string float8_unsupported_on(const c10::Device& device, Float8Scaling scaling) {
  if (device.is_cpu()) return {};
  if (!device.is_cuda()) {
    return fmt::format("float8 GEMMs run on the CPU and on CUDA GPUs, not on {}", device.str());
  }
#ifdef FSDP_HAVE_TORCH_CUDA
  const auto index = device.has_index() ? device.index() : c10::cuda::current_device();
  const auto* p = at::cuda::getDeviceProperties(index);
  const int cc = p->major * 10 + p->minor;
  if (scaling == Float8Scaling::tensorwise && cc >= 89) return {};
  // _scaled_mm's rowwise kernels: sm_89, sm_90 and sm_100 families (cuBLAS has none either).
  if (scaling == Float8Scaling::rowwise && (cc == 89 || p->major == 9 || p->major == 10)) return {};
  return fmt::format(
      "float8 GEMMs ({} recipe) need a GPU of compute capability {}; cuda:{} ({}) is {}.{}: "
      "train without float8 there",
      scaling == Float8Scaling::tensorwise ? "tensorwise" : "rowwise",
      scaling == Float8Scaling::tensorwise ? "8.9 or newer (Ada, Hopper, Blackwell)"
                                           : "8.9, 9.x or 10.x (Ada, Hopper, B200 and B300)",
      index, p->name, p->major, p->minor);
#else
  return fmt::format("float8 on {}: this libtorch was built without CUDA", device.str());
#endif
}

namespace {

// float8_unsupported_on's message as fsdp::UnsupportedError, from `op`, for a tensor off the CPU.
void check_float8_device(const char* op, const at::Tensor& t, Float8Scaling scaling) {
  if (t.is_cpu()) return;
  if (const auto why = float8_unsupported_on(t.device(), scaling); !why.empty()) {
    throw UnsupportedError(fmt::format("{}: {}", op, why));
  }
}

}  // namespace

at::Tensor float8_mm(const Float8Tensor& a, const Float8Tensor& b, at::ScalarType out_dtype,
                     std::optional<bool> fast_accum) {
  FSDP_CHECK_ARG(a.data.dim() == 2 && b.data.dim() == 2 && a.data.size(1) == b.data.size(0),
                 "float8_mm: expected [m, k] @ [k, n], got {} @ {}", a.data.sizes(),
                 b.data.sizes());
  const int64_t m = a.data.size(0), n = b.data.size(1);
  const bool rowwise = a.scale.numel() != 1 || b.scale.numel() != 1;
  check_float8_device("float8_mm", a.data,
                      rowwise ? Float8Scaling::rowwise : Float8Scaling::tensorwise);
  FSDP_CHECK_ARG(!rowwise || (a.scale.sizes() == at::IntArrayRef{m, 1} &&
                              b.scale.sizes() == at::IntArrayRef{1, n}),
                 "float8_mm: expected scales of one element each, or [{}, 1] and [1, {}] "
                 "(rowwise), got {} and {}",
                 m, n, a.scale.sizes(), b.scale.sizes());
  // The forward's GEMM with fast accumulation (torchao's gemm_config_output), as the CPU
  // ignores it and Hopper's float8 GEMMs gain from it; the backward's without.
  const bool fast = fast_accum.value_or(a.data.scalar_type() == at::kFloat8_e4m3fn);
  if (rowwise && !a.data.is_cuda()) {
    // torchao's emulation (Float8LinearConfig.emulate): the dequantized operands in float32.
    return at::mm(a.data.to(at::kFloat) / a.scale, b.data.to(at::kFloat) / b.scale).to(out_dtype);
  }
  // torchao's preprocess_addmm: _scaled_mm takes a row-major and b column-major.
  auto a_data = row_major(a.data) ? a.data : a.data.contiguous();
  auto b_data = row_major(b.data) ? b.data.t().contiguous().t() : b.data;
  auto a_inverse = a.scale.reciprocal(), b_inverse = b.scale.reciprocal();
  if (!rowwise) {
    return at::_scaled_mm(a_data, b_data, a_inverse, b_inverse, /*bias=*/std::nullopt,
                          /*scale_result=*/std::nullopt, out_dtype, fast);
  }
  // torchao's addmm_float8_unwrapped with rowwise scales: without fast accumulation the
  // tensorwise kernel and the scales after it (the rowwise kernel is slow then); a float32 or
  // float16 result computed in bf16 (_scaled_mm's rowwise form returns bf16 only).
  // The scales after the GEMM as two in-place products, not torchao's [m, n] product of them
  // (hundreds of MB at a layer's tokens x features, which eager C++ does not fuse away): the same
  // bits for the recipe's power-of-2 scales.
  const auto one = fast ? at::Tensor() : at::ones({}, a_inverse.options());
  const auto mm_dtype =
      out_dtype == at::kFloat || out_dtype == at::kHalf ? at::kBFloat16 : out_dtype;
  auto out = at::_scaled_mm(a_data, b_data, fast ? a_inverse : one, fast ? b_inverse : one,
                            /*bias=*/std::nullopt, /*scale_result=*/std::nullopt, mm_dtype, fast);
  if (!fast) out.mul_(a_inverse).mul_(b_inverse);
  return out.to(out_dtype);
}

std::string float8_linear_unsupported(int64_t in, int64_t out) {
  if (in % 16 == 0 && out % 16 == 0) return {};
  return fmt::format(
      "a Linear of {} inputs and {} outputs: float8 GEMMs need both to be "
      "multiples of 16",
      in, out);
}

at::Tensor float8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                         const at::Tensor& weight_scale, Float8Scaling scaling) {
  check_float8_device("float8_linear", x, scaling);
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
  FSDP_CHECK_ARG(!weight_scale.defined() || weight_scale.numel() == 1,
                 "float8_linear: expected a weight scale of one element, got {}",
                 weight_scale.numel());
  FSDP_CHECK_ARG(!weight_scale.defined() || scaling == Float8Scaling::tensorwise,
                 "float8_linear: a gathered weight scale is tensorwise; rowwise scaling casts the "
                 "weight by rows itself");
  // In no-grad mode (evaluation) or for a frozen weight no weight gradient can be asked for.
  const bool weight_grad = at::GradMode::is_enabled() && weight.requires_grad();
  auto y = Float8Matmul::apply(x.reshape({-1, x.size(-1)}), weight,
                               Float8Matmul::Scale{weight_scale, scaling, weight_grad})
               .reshape(out_shape);
  // Float8Linear.forward: the bias added after the GEMM, in the output's dtype.
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

}  // namespace fsdp::ops
