// fsdp/ops/fused.h on the CPU: the ATen twins (transformers' Llama formulas op for op, which the
// Llama parity tests hold to transformers' logits and losses), and bad shapes refused. The
// kernels themselves are test_cuda's FusedCuda tests.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "fsdp/errors.h"
#include "fsdp/ops/fused.h"

namespace fsdp::testing::fused_test {
namespace {

TEST(Fused, TheCpuRunsTheTwinsBitForBit) {
  torch::manual_seed(2);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto x = (torch::randn({2, 5, 48}) * 2).to(dtype);
    auto w = (torch::rand({48}) + 0.5).to(dtype);
    auto h = x.to(at::kFloat);
    h = h * at::rsqrt(h.pow(2).mean(-1, true) + 1e-6);
    EXPECT_TRUE(ops::rms_norm(x, w, 1e-6).equal(w * h.to(dtype)));
    auto g = torch::randn({2, 5, 48}).to(dtype), u = torch::randn({2, 5, 48}).to(dtype);
    EXPECT_TRUE(ops::swiglu(g, u).equal(at::silu(g) * u));
  }
}

TEST(Fused, RefusesShapesThatDoNotFit) {
  EXPECT_THROW(ops::rms_norm(torch::randn({4, 8}), torch::ones({7}), 1e-6), InvalidArgument);
  EXPECT_THROW(ops::swiglu(torch::randn({4, 8}), torch::randn({4, 9})), InvalidArgument);
  EXPECT_THROW(ops::swiglu(torch::randn({4, 8}), torch::randn({4, 8}).to(at::kBFloat16)),
               InvalidArgument);
}

}  // namespace
}  // namespace fsdp::testing::fused_test
