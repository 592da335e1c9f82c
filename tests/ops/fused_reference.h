// What the fused kernels' tests on the GPU (test_fused_cuda.cpp) and in the CPU emulator
// (test_cuda_kernels_emulated.cpp) share: the formula RMSNorm's kernel must equal, the tolerance
// per dtype, and inputs stored off a 16-byte boundary.
#pragma once

#include <ATen/ATen.h>

namespace fsdp::testing {

// transformers' LlamaRMSNorm, written out (not the library's twin) so that the comparison is
// with the formula itself.
inline at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return w * h.to(x.scalar_type());
}

// fp32 to float rounding; bf16 and half within a few of their rounding steps.
inline double tolerance(at::ScalarType t) { return t == at::kFloat ? 2e-5 : 2e-2; }

// `values` copied to a contiguous tensor of `opts`, starting one element into its storage when
// `offset` (then off a 16-byte boundary: the kernels' single-element paths).
inline at::Tensor stored(const at::Tensor& values, const at::TensorOptions& opts, bool offset) {
  const int64_t n = values.numel(), skip = offset ? 1 : 0;
  auto t = at::empty({n + skip}, opts).narrow(0, skip, n).view(values.sizes());
  t.copy_(values);
  return t;
}

}  // namespace fsdp::testing
