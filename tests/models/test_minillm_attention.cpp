// MiniLLM's batch-first attention (the GPU's path, SelfAttention::forward_batch_first) equals
// nn.MultiheadAttention's steps (forward, the CPU's and the FSDP2 reference's path) on the CPU:
// outputs and the gradients of the input and of every parameter, in float32 to rounding and in
// bf16 within its rounding; with the float8 projections too (the same casts of the same values).
// The GPU test (test_minillm_cuda.cpp) checks that the GPU takes it (its output is contiguous).
#include <gtest/gtest.h>

#include <string>

#include "fsdp/models/minillm.h"
#include "support/tensor_compare.h"
#include "support/torch_api.h"

namespace fsdp::testing::minillm_attention_test {
namespace {

namespace mm = fsdp::models::minillm;

struct Case {
  at::ScalarType dtype;
  bool float8;
  double tol;
};

TEST(MiniLLMAttention, BatchFirstEqualsMultiheadAttentionsSteps) {
  for (const auto& c : {Case{at::kFloat, false, 1e-6}, Case{at::kBFloat16, false, 2e-2},
                        Case{at::kFloat, true, 1e-6}}) {
    const auto where = ::testing::Message()
                       << c10::toString(c.dtype) << (c.float8 ? " float8" : "");
    torch::manual_seed(9);
    mm::SelfAttention attn(64, 4, c.float8);
    attn->to(c.dtype);
    {
      torch::NoGradGuard no_grad;  // biases that are not zero, so that a lost one shows
      attn->in_proj_bias.uniform_(-0.5, 0.5);
      attn->out_proj->bias.uniform_(-0.5, 0.5);
    }
    const auto x = torch::randn({3, 17, 64}).to(c.dtype);
    const auto dy = torch::randn({3, 17, 64}).to(c.dtype);
    auto run = [&](bool batch_first) {
      attn->zero_grad();
      auto xi = x.clone().requires_grad_();
      auto y = batch_first ? attn->forward_batch_first(xi) : attn->forward(xi);
      y.backward(dy);
      std::vector<at::Tensor> out{y.detach(), xi.grad()};
      for (const auto& p : attn->parameters()) out.push_back(p.grad().clone());
      return out;
    };
    const auto want = run(false), got = run(true);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got[0].sizes(), want[0].sizes()) << where;
    EXPECT_TRUE(got[0].is_contiguous()) << where << ": the residual add after it would copy";
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_LT(rel_diff(got[i], want[i]), c.tol) << where
                                                  << (i == 0   ? " output"
                                                      : i == 1 ? " input gradient"
                                                               : " parameter gradient");
    }
  }
}

}  // namespace
}  // namespace fsdp::testing::minillm_attention_test
