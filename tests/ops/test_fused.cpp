// fsdp/ops/fused.h on the CPU: the ATen twins (transformers' Llama formulas op for op, which the
// Llama parity tests hold to transformers' logits and losses), and bad shapes refused. The
// kernels themselves are test_cuda's FusedCuda tests.
#include <gtest/gtest.h>

#include "fsdp/errors.h"
#include "fsdp/ops/fused.h"
#include "support/torch_api.h"

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
    auto [sum, normed] = ops::add_rms_norm(x, g, w, 1e-6);
    EXPECT_TRUE(sum.equal(x + g));
    EXPECT_TRUE(normed.equal(ops::rms_norm(x + g, w, 1e-6)));
    // apply_rotary_pos_emb on a heads-first view of a [batch, seq, heads, d] projection, with
    // positions shared by the batch (cos [1, seq, d]) and per sequence ([batch, seq, d]).
    auto q = torch::randn({2, 5, 3, 8}).to(dtype).transpose(1, 2);
    for (int64_t cos_batch : {1, 2}) {
      auto cos = torch::randn({cos_batch, 5, 8}).to(dtype),
           sin = torch::randn({cos_batch, 5, 8}).to(dtype);
      auto rotated = torch::cat({-q.slice(-1, 4), q.slice(-1, 0, 4)}, -1);
      EXPECT_TRUE(ops::rope(q, cos, sin).equal(q * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)));
    }
  }
}

TEST(Fused, RefusesShapesThatDoNotFit) {
  EXPECT_THROW(ops::rms_norm(torch::randn({4, 8}), torch::ones({7}), 1e-6), InvalidArgument);
  EXPECT_THROW(ops::swiglu(torch::randn({4, 8}), torch::randn({4, 9})), InvalidArgument);
  EXPECT_THROW(
      ops::add_rms_norm(torch::randn({4, 8}), torch::randn({4, 7}), torch::ones({8}), 1e-6),
      InvalidArgument);
  EXPECT_THROW(
      ops::add_rms_norm(torch::randn({4, 8}), torch::randn({4, 8}), torch::ones({7}), 1e-6),
      InvalidArgument);
  const auto q = torch::randn({2, 3, 5, 8});
  EXPECT_THROW(ops::rope(q, torch::randn({1, 5, 6}), torch::randn({1, 5, 6})), InvalidArgument);
  EXPECT_THROW(ops::rope(q, torch::randn({3, 5, 8}), torch::randn({3, 5, 8})), InvalidArgument);
  EXPECT_THROW(ops::rope(q.narrow(-1, 0, 7), torch::randn({1, 5, 7}), torch::randn({1, 5, 7})),
               InvalidArgument);
  EXPECT_THROW(ops::rope(q, torch::randn({1, 5, 8}), torch::randn({1, 4, 8})), InvalidArgument);
  EXPECT_THROW(ops::swiglu(torch::randn({4, 8}), torch::randn({4, 8}).to(at::kBFloat16)),
               InvalidArgument);
}

}  // namespace
}  // namespace fsdp::testing::fused_test
