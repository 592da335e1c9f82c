#include "fsdp/ops/fused.h"

#include <fmt/ranges.h>  // shapes (ArrayRef) in messages
#include <torch/autograd.h>

#include "util/check.h"

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda_dispatch.h"
#endif

namespace fsdp::ops {
namespace {

at::Tensor rms_norm_twin(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto h = x.to(at::kFloat);
  const auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * at::rsqrt(variance + eps);
  return weight * h.to(x.scalar_type());
}

at::Tensor swiglu_twin(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

// transformers' rotate_half: the two halves of the last dimension, (-x2, x1).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

at::Tensor rope_twin(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  return (x * c) + (rotate_half(x) * s);
}

#ifdef FSDP_HAVE_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using detail::check_launch;
using detail::kernel_dtype;
using detail::kernels_run_on;
using detail::stream_of;

// The norm's backward kernel: dx (x's dtype) and, when `want_dw` (the weight is not frozen),
// the weight's gradient (summed in float32, then the weight's dtype); else an undefined one.
std::pair<at::Tensor, at::Tensor> rms_norm_backward(const at::Tensor& dy_in, const at::Tensor& x,
                                                    const at::Tensor& w, const at::Tensor& rstd,
                                                    bool want_dw) {
  const auto dy = dy_in.contiguous();
  const int64_t d = x.size(-1), n = x.numel() / std::max<int64_t>(d, 1);
  auto dx = at::empty_like(x);
  at::Tensor dw, workspace;
  if (want_dw) {
    dw = at::empty({d}, x.options().dtype(at::kFloat));
    workspace = at::empty({cuda::rms_norm_workspace_floats(n, d)}, x.options().dtype(at::kFloat));
  }
  check_launch(cuda::rms_norm_backward(
                   *kernel_dtype(x.scalar_type()), dy.data_ptr(), x.data_ptr(), w.data_ptr(),
                   rstd.data_ptr<float>(), dx.data_ptr(), want_dw ? dw.data_ptr<float>() : nullptr,
                   want_dw ? workspace.data_ptr<float>() : nullptr, n, d, stream_of(x)),
               "rms_norm backward");
  return {dx, want_dw ? dw.to(w.scalar_type()) : at::Tensor()};
}

// The norm's forward kernel over the rows of h = x, or of h = x + y (the residual add in the
// same pass) when `y` is defined: h, the norm and each row's rsqrt, for the backward.
struct NormRows {
  at::Tensor h, out, rstd;
};
NormRows norm_rows(const at::Tensor& x_in, const at::Tensor& y_in, const at::Tensor& w,
                   double eps) {
  const auto x = x_in.contiguous();
  const int64_t d = x.size(-1), n = x.numel() / std::max<int64_t>(d, 1);
  NormRows r{x, at::empty_like(x), at::empty({n}, x.options().dtype(at::kFloat))};
  const auto dtype = *kernel_dtype(x.scalar_type());
  const auto e = static_cast<float>(eps);
  if (y_in.defined()) {
    const auto y = y_in.contiguous();
    r.h = at::empty_like(x);
    check_launch(cuda::add_rms_norm_forward(dtype, x.data_ptr(), y.data_ptr(), r.h.data_ptr(),
                                            w.data_ptr(), r.out.data_ptr(),
                                            r.rstd.data_ptr<float>(), n, d, e, stream_of(x)),
                 "add_rms_norm");
  } else {
    check_launch(cuda::rms_norm_forward(dtype, x.data_ptr(), w.data_ptr(), r.out.data_ptr(),
                                        r.rstd.data_ptr<float>(), n, d, e, stream_of(x)),
                 "rms_norm");
  }
  return r;
}

class RmsNormFunction : public torch::autograd::Function<RmsNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w_in,
                            double eps) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto w = w_in.contiguous();
    auto r = norm_rows(x, {}, w, eps);
    ctx->save_for_backward({r.h, w, r.rstd});
    return r.out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    c10::cuda::CUDAGuard guard(x.device());
    auto [dx, dw] = rms_norm_backward(grads[0], x, w, saved[2], ctx->needs_input_grad(1));
    return {dx, dw, at::Tensor()};
  }
};

// h = x + y and its norm, one kernel forward (fused.h's add_rms_norm). Backward: the norm's
// kernel on h, plus the gradient h gets from its other uses, once for x and once for y.
class AddRmsNormFunction : public torch::autograd::Function<AddRmsNormFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& y,
                               const at::Tensor& w_in, double eps) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto w = w_in.contiguous();
    auto r = norm_rows(x, y, w, eps);
    ctx->save_for_backward({r.h, w, r.rstd});
    // h's gradient from its other uses is undefined when it has none: no zeros made and added.
    ctx->set_materialize_grads(false);
    return {r.h, r.out};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &h = saved[0], &w = saved[1];
    c10::cuda::CUDAGuard guard(h.device());
    at::Tensor dh = grads[0], dw;
    if (grads[1].defined()) {
      auto [dh_norm, dw_norm] =
          rms_norm_backward(grads[1], h, w, saved[2], ctx->needs_input_grad(2));
      // The twin's autograd sums h's two gradients in the dtype, as this add does.
      dh = dh.defined() ? dh + dh_norm : dh_norm;
      dw = dw_norm;
    }
    return {dh, dh, dw, at::Tensor()};
  }
};

class SwigluFunction : public torch::autograd::Function<SwigluFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_in,
                            const at::Tensor& up_in) {
    c10::cuda::CUDAGuard guard(gate_in.device());
    const auto gate = gate_in.contiguous(), up = up_in.contiguous();
    auto out = at::empty_like(gate);
    check_launch(cuda::swiglu_forward(*kernel_dtype(gate.scalar_type()), gate.data_ptr(),
                                      up.data_ptr(), out.data_ptr(), gate.numel(), stream_of(gate)),
                 "swiglu");
    ctx->save_for_backward({gate, up});
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1];
    c10::cuda::CUDAGuard guard(gate.device());
    const auto dout = grads[0].contiguous();
    auto dgate = at::empty_like(gate), dup = at::empty_like(up);
    check_launch(cuda::swiglu_backward(*kernel_dtype(gate.scalar_type()), dout.data_ptr(),
                                       gate.data_ptr(), up.data_ptr(), dgate.data_ptr(),
                                       dup.data_ptr(), gate.numel(), stream_of(gate)),
                 "swiglu backward");
    return {dgate, dup};
  }
};

// The kernels work on [batch, seq, heads, d] rows: x's usual memory order (a projection's
// output viewed heads-first), so the transposes are views.
class RopeFunction : public torch::autograd::Function<RopeFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos_in,
                            const at::Tensor& sin_in) {
    c10::cuda::CUDAGuard guard(x.device());
    const auto cos = cos_in.contiguous(), sin = sin_in.contiguous();
    ctx->save_for_backward({cos, sin});
    return launch(x, cos, sin, /*backward=*/false);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    c10::cuda::CUDAGuard guard(grads[0].device());
    return {launch(grads[0], saved[0], saved[1], /*backward=*/true), at::Tensor(), at::Tensor()};
  }

 private:
  // t [batch, heads, seq, d] through the kernel, returned in the same logical shape.
  static at::Tensor launch(const at::Tensor& t, const at::Tensor& cos, const at::Tensor& sin,
                           bool backward) {
    const auto rows = t.transpose(1, 2).contiguous();  // [batch, seq, heads, d]
    auto out = at::empty_like(rows);
    const auto run = backward ? cuda::rope_backward : cuda::rope_forward;
    check_launch(run(*kernel_dtype(t.scalar_type()), rows.data_ptr(), cos.data_ptr(),
                     sin.data_ptr(), out.data_ptr(), rows.size(0), rows.size(1), rows.size(2),
                     rows.size(3), cos.size(0), stream_of(rows)),
                 backward ? "rope backward" : "rope");
    return out.transpose(1, 2);
  }
};
#endif

}  // namespace

bool cuda_kernels_built() {
#ifdef FSDP_HAVE_CUDA_KERNELS
  return true;
#else
  return false;
#endif
}

bool cuda_kernels_run_on(const at::Tensor& t) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  return kernels_run_on(t);
#else
  (void)t;
  return false;
#endif
}

bool rms_norm_uses_kernel(const at::Tensor& x, const at::Tensor& weight) {
  return cuda_kernels_run_on(x) && weight.device() == x.device() &&
         weight.scalar_type() == x.scalar_type() && x.numel() > 0;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  FSDP_CHECK_ARG(x.dim() >= 1 && weight.dim() == 1 && weight.size(0) == x.size(-1),
                 "rms_norm: expected x [..., d] and weight [d], got {} and {}", x.sizes(),
                 weight.sizes());
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (rms_norm_uses_kernel(x, weight)) return RmsNormFunction::apply(x, weight, eps);
#endif
  return rms_norm_twin(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& y,
                                               const at::Tensor& weight, double eps) {
  FSDP_CHECK_ARG(x.sizes() == y.sizes() && x.scalar_type() == y.scalar_type() && x.dim() >= 1 &&
                     weight.dim() == 1 && weight.size(0) == x.size(-1),
                 "add_rms_norm: expected x and y [..., d] of one dtype and weight [d], got {} "
                 "({}), {} ({}) and {}",
                 x.sizes(), c10::toString(x.scalar_type()), y.sizes(),
                 c10::toString(y.scalar_type()), weight.sizes());
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (rms_norm_uses_kernel(x, weight) && y.device() == x.device()) {
    auto hn = AddRmsNormFunction::apply(x, y, weight, eps);
    return {hn[0], hn[1]};
  }
#endif
  auto h = x + y;
  return {h, rms_norm(h, weight, eps)};
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up) {
  FSDP_CHECK_ARG(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
                 "swiglu: gate and up must share shape and dtype, got {} ({}) and {} ({})",
                 gate.sizes(), c10::toString(gate.scalar_type()), up.sizes(),
                 c10::toString(up.scalar_type()));
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(gate) && up.device() == gate.device() && gate.numel() > 0) {
    return SwigluFunction::apply(gate, up);
  }
#endif
  return swiglu_twin(gate, up);
}

at::Tensor rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  FSDP_CHECK_ARG(x.dim() == 4 && x.size(-1) % 2 == 0 && cos.dim() == 3 &&
                     cos.sizes() == sin.sizes() && cos.size(1) == x.size(2) &&
                     cos.size(2) == x.size(3) && (cos.size(0) == 1 || cos.size(0) == x.size(0)),
                 "rope: expected x [batch, heads, seq, d] with d even and cos, sin [1 or batch, "
                 "seq, d], got {}, {} and {}",
                 x.sizes(), cos.sizes(), sin.sizes());
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(x) && cos.device() == x.device() && sin.device() == x.device() &&
      cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
      !cos.requires_grad() && !sin.requires_grad() && x.numel() > 0) {
    return RopeFunction::apply(x, cos, sin);
  }
#endif
  return rope_twin(x, cos, sin);
}

}  // namespace fsdp::ops
