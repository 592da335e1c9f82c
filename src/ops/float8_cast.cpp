#include "ops/float8_cast.h"

#include "fsdp/ops/float8.h"
#include "util/check.h"

#ifdef FSDP_HAVE_CUDA_KERNELS
#include <c10/cuda/CUDAGuard.h>

#include "ops/cuda/float8_kernels.h"
#include "ops/cuda_dispatch.h"
#endif

namespace fsdp::ops::detail {
namespace {

// [k, padded] bytes, the columns from m on zero: the storage of a column-major [padded, k].
at::Tensor col_storage(const at::Tensor& t, at::ScalarType dtype, int64_t padded) {
  const int64_t m = t.size(0), k = t.size(1);
  auto s = at::empty({k, padded}, t.options().dtype(at::kByte));
  s.narrow(1, m, padded - m).zero_();
  return s.view(dtype);
}

#ifdef FSDP_HAVE_CUDA_KERNELS
cuda::Float8Format format_of(at::ScalarType dtype) {
  return dtype == at::kFloat8_e4m3fn ? cuda::Float8Format::kE4M3 : cuda::Float8Format::kE5M2;
}
#endif

}  // namespace

double float8_max(at::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

at::Tensor saturated_cast(const at::Tensor& t, const at::Tensor& scale, at::ScalarType dtype) {
  const double max = float8_max(dtype);
  return (t.to(at::kFloat) * scale).clamp_(-max, max).to(dtype);
}

at::Tensor abs_max(const at::Tensor& t) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(t)) {
    c10::cuda::CUDAGuard guard(t.device());
    const auto x = t.contiguous();
    auto amax = at::empty({}, x.options().dtype(at::kFloat));
    check_launch(cuda::abs_max(*kernel_dtype(x.scalar_type()), x.data_ptr(), x.numel(),
                               amax.data_ptr<float>(), stream_of(x)),
                 "float8 amax");
    return amax;
  }
#endif
  // float64 keeps its own (torchao's scale is computed from it unrounded); the narrower dtypes
  // are exact in float32.
  const auto m = t.abs().max();
  return t.scalar_type() == at::kDouble ? m : m.to(at::kFloat);
}

Float8Cast cast_to_float8(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& scale,
                          bool row, bool col, int64_t pad_to) {
  FSDP_CHECK_ARG(at::isFloatingType(t.scalar_type()) && t.numel() > 0,
                 "float8 cast: expected a non-empty floating tensor, got {} of {} elements",
                 c10::toString(t.scalar_type()), t.numel());
  FSDP_CHECK_ARG(row || col,
                 "float8 cast: asked for neither the row-major nor the column-major "
                 "result");
  FSDP_CHECK_ARG(!col || t.dim() == 2,
                 "float8 cast: a column-major cast needs a 2-D tensor, got {}", t.sizes());
  const int64_t m = col ? t.size(0) : 0;
  const int64_t padded = (m + pad_to - 1) / pad_to * pad_to;
  Float8Cast out;
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(t) && (!scale.defined() || scale.device() == t.device())) {
    c10::cuda::CUDAGuard guard(t.device());
    const auto x = t.contiguous();
    at::Tensor amax;
    if (scale.defined()) {
      out.scale = scale.to(at::kFloat).contiguous().reshape({});
    } else {
      amax = abs_max(x);
      out.scale = at::empty({}, x.options().dtype(at::kFloat));
    }
    if (row) out.row = at::empty(x.sizes(), x.options().dtype(dtype));
    at::Tensor storage = col ? col_storage(x, dtype, padded) : at::Tensor();
    const int64_t rows = col ? m : 1, cols = col ? x.size(1) : x.numel();
    check_launch(cuda::float8_cast(*kernel_dtype(x.scalar_type()), format_of(dtype), x.data_ptr(),
                                   rows, cols, amax.defined() ? amax.data_ptr<float>() : nullptr,
                                   out.scale.data_ptr<float>(), row ? out.row.data_ptr() : nullptr,
                                   col ? storage.data_ptr() : nullptr, padded, stream_of(x)),
                 "float8 cast");
    if (col) out.col = storage.t();
    return out;
  }
#endif
  out.scale = scale.defined() ? scale.reshape({}) : float8_scale(abs_max(t), dtype);
  auto data = saturated_cast(t, out.scale, dtype);
  if (col) {
    if (padded == m) {
      out.col = data.t().contiguous().t();
    } else {
      auto storage = col_storage(data, dtype, padded);
      storage.view(at::kByte).narrow(1, 0, m).copy_(data.view(at::kByte).t());
      out.col = storage.t();
    }
  }
  if (row) out.row = std::move(data);
  return out;
}

Float8Axiswise cast_to_float8_axiswise(const at::Tensor& t, at::ScalarType dtype, int64_t dim) {
#ifdef FSDP_HAVE_CUDA_KERNELS
  if (kernels_run_on(t)) {
    c10::cuda::CUDAGuard guard(t.device());
    const auto x = t.contiguous();
    const int64_t rows = x.size(0), cols = x.size(1);
    Float8Axiswise out{at::empty(x.sizes(), x.options().dtype(dtype)),
                       at::empty(dim == 1 ? at::IntArrayRef{rows, 1} : at::IntArrayRef{1, cols},
                                 x.options().dtype(at::kFloat))};
    check_launch(
        cuda::float8_cast_axiswise(*kernel_dtype(x.scalar_type()), format_of(dtype), x.data_ptr(),
                                   rows, cols, static_cast<int>(dim), out.scale.data_ptr<float>(),
                                   out.data.data_ptr(), stream_of(x)),
        "float8 rowwise cast");
    return out;
  }
#endif
  // torchao's tensor_to_amax (axiswise), amax_to_scale, _round_scale_down_to_power_of_2.
  auto scale = float8_scale(t.abs().amax({dim}, /*keepdim=*/true), dtype);
  scale = at::exp2(at::floor(at::log2(scale)));
  return {saturated_cast(t, scale, dtype), scale};
}

}  // namespace fsdp::ops::detail
