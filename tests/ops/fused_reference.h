// What the fused kernels' tests on the GPU (test_fused_cuda.cpp) and in the CPU emulator
// (test_cuda_kernels_emulated.cpp) share: the formula RMSNorm's kernel must equal and the
// tolerance per dtype.
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

}  // namespace fsdp::testing
