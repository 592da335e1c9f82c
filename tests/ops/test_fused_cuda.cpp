// The CUDA kernels of fsdp/ops/fused.h against their ATen twins on the GPU: RMSNorm and SwiGLU,
// forward and backward, fp32 (to float rounding) and bf16 (within a few of bf16's rounding
// steps), over row lengths that do not divide by the block (3, 1000, 2048), more rows than the
// backward's blocks, and more elements than one pass of SwiGLU's grid. Skips without a GPU,
// fails under FSDP_REQUIRE_GPU=1, where the kernels must also be built.
#include <ATen/cuda/CUDAContext.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/fused.h"
#include "support/gpu.h"

namespace fsdp::testing::fused_cuda_test {
namespace {

// max |a - b| / max |b|
double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>() /
         std::max(b.to(at::kDouble).abs().max().item<double>(), 1e-30);
}

// The twins, written out here (not the library's fallback) so that the comparison is with
// transformers' formulas themselves.
at::Tensor rms_norm_reference(const at::Tensor& x, const at::Tensor& w, double eps) {
  auto h = x.to(at::kFloat);
  h = h * at::rsqrt(h.pow(2).mean(-1, true) + eps);
  return w * h.to(x.scalar_type());
}

double tolerance(at::ScalarType t) { return t == at::kFloat ? 2e-5 : 2e-2; }

TEST(FusedCuda, KernelsAreBuiltForTheGpuCheck) {
  FSDP_SKIP_WITHOUT_GPU();
  if (gpu_required()) {
    EXPECT_TRUE(ops::cuda_kernels_built());
  }
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
}

TEST(FusedCuda, RmsNormEqualsLlamasFormula) {
  FSDP_SKIP_WITHOUT_GPU();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    // Rows of 3, 1000 and 2048; 51 rows (a block each) and 1200 (several per block in the
    // backward, whose blocks then sum their weight-gradient parts).
    for (auto [rows, d] :
         std::vector<std::pair<int64_t, int64_t>>{{51, 3}, {51, 1000}, {51, 2048}, {1200, 2048}}) {
      torch::manual_seed(5);
      const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
      auto x = (torch::randn({rows, d}) * 3).to(opts);
      auto w = (torch::rand({d}) + 0.5).to(opts);
      auto dy = torch::randn({rows, d}).to(opts);
      auto xa = x.clone().requires_grad_(), wa = w.clone().requires_grad_();
      auto xb = x.clone().requires_grad_(), wb = w.clone().requires_grad_();
      auto ya = ops::rms_norm(xa, wa, 1e-5);
      auto yb = rms_norm_reference(xb, wb, 1e-5);
      ya.backward(dy);
      yb.backward(dy);
      const auto tol = tolerance(dtype);
      EXPECT_EQ(ya.scalar_type(), dtype);
      EXPECT_LT(rel_diff(ya, yb), tol) << c10::toString(dtype) << " rows " << rows << " d " << d;
      EXPECT_LT(rel_diff(xa.grad(), xb.grad()), tol)
          << c10::toString(dtype) << " rows " << rows << " d " << d;
      EXPECT_LT(rel_diff(wa.grad(), wb.grad()), tol)
          << c10::toString(dtype) << " rows " << rows << " d " << d;
    }
  }
}

TEST(FusedCuda, SwigluEqualsSiluTimesUp) {
  FSDP_SKIP_WITHOUT_GPU();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    torch::manual_seed(6);
    const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
    // 17.3M elements: more than the grid's 65535 blocks of 256 cover in one pass.
    auto gate = (torch::randn({33, 512, 1025}) * 4).to(opts);
    auto up = torch::randn({33, 512, 1025}).to(opts);
    auto dout = torch::randn({33, 512, 1025}).to(opts);
    auto ga = gate.clone().requires_grad_(), ua = up.clone().requires_grad_();
    auto gb = gate.clone().requires_grad_(), ub = up.clone().requires_grad_();
    auto oa = ops::swiglu(ga, ua);
    auto ob = at::silu(gb) * ub;
    oa.backward(dout);
    ob.backward(dout);
    const auto tol = tolerance(dtype);
    EXPECT_LT(rel_diff(oa, ob), tol) << c10::toString(dtype);
    EXPECT_LT(rel_diff(ga.grad(), gb.grad()), tol) << c10::toString(dtype);
    EXPECT_LT(rel_diff(ua.grad(), ub.grad()), tol) << c10::toString(dtype);
  }
}

// float8_linear on the GPU (sm_89 or newer: _scaled_mm) against the CPU's, with 21 tokens: the
// weight gradient's GEMM runs over the tokens, padded to 32 for the GPU.
TEST(FusedCuda, Float8LinearWithTokensNotAMultipleOf16) {
  FSDP_SKIP_WITHOUT_GPU();
  if (at::cuda::getCurrentDeviceProperties()->major < 9) GTEST_SKIP() << "float8 needs sm_89+";
  torch::manual_seed(8);
  auto x = torch::randn({3, 7, 64}), w = torch::randn({48, 64}) * 0.1,
       dy = torch::randn({3, 7, 48});
  auto xc = x.clone().requires_grad_(), wc = w.clone().requires_grad_();
  auto xg = x.cuda().requires_grad_(), wg = w.cuda().requires_grad_();
  auto yc = ops::float8_linear(xc, wc, {});
  auto yg = ops::float8_linear(xg, wg, {});
  yc.backward(dy);
  yg.backward(dy.cuda());
  EXPECT_LT(rel_diff(yg.cpu(), yc), 1e-5);
  EXPECT_LT(rel_diff(xg.grad().cpu(), xc.grad()), 1e-5);
  EXPECT_LT(rel_diff(wg.grad().cpu(), wc.grad()), 1e-5);
}

}  // namespace
}  // namespace fsdp::testing::fused_cuda_test
