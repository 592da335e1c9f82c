// ops::linear_cross_entropy against the unfused head and loss (at::linear, then
// cross_entropy on fp32 logits): the loss and the gradients of the hidden states and the weight,
// chunk sizes from 1 token to more than all, ignored targets, none counted, a frozen weight,
// bf16, and the vocabulary-parallel form on thread ranks against the whole vocabulary.
#include <gtest/gtest.h>

#include <vector>

#include "fsdp/errors.h"
#include "fsdp/ops/linear_cross_entropy.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "ops/linear_cross_entropy_util.h"
#include "support/torch_api.h"

namespace fsdp::testing {
namespace {

using lce::Case;
using lce::fused;
using lce::unfused;
using ops::linear_cross_entropy;
using ops::LinearCrossEntropyOptions;

// N tokens, hidden d, vocabulary V (odd sizes), about a fifth of the targets ignored.
Case make_case(int64_t n, int64_t d, int64_t v, at::ScalarType dtype = at::kFloat) {
  torch::manual_seed(7);
  Case c;
  c.hidden = (torch::randn({n, d}) * 2).to(dtype).requires_grad_();
  c.weight = (torch::randn({v, d}) * 0.3).to(dtype).requires_grad_();
  c.targets = torch::randint(0, v, {n}, torch::kLong);
  c.targets.masked_fill_(torch::rand({n}) < 0.2, -100);
  return c;
}

// fp32: the same operations, summed in other orders (a one-row chunk's GEMM is a GEMV: 1.1e-6
// measured on the hidden states' gradient), so within a few units of fp32's 1.2e-7 of the
// largest element.
constexpr double kFp32 = 5e-6;

TEST(LinearCrossEntropy, EqualsTheUnfusedLossAndGradientsAtEveryChunk) {
  auto c = make_case(37, 24, 1001);
  auto want = unfused(c);
  for (int64_t chunk : {0, 1, 5, 36, 37, 500}) {
    LinearCrossEntropyOptions o;
    o.chunk_tokens = chunk;
    auto got = fused(c, o);
    EXPECT_LT(rel_diff(got.loss, want.loss), kFp32) << "chunk " << chunk;
    EXPECT_LT(rel_diff(got.grad_h, want.grad_h), kFp32) << "chunk " << chunk;
    EXPECT_LT(rel_diff(got.grad_w, want.grad_w), kFp32) << "chunk " << chunk;
  }
}

TEST(LinearCrossEntropy, TheAutomaticChunkFollowsTheVocabulary) {
  // Liger-Kernel's rule (tokens * hidden / vocab rows, a power of two), at least 256 MiB of
  // fp32 logits' rows, at most every token.
  EXPECT_EQ(ops::linear_cross_entropy_chunk(8192, 2048, 128256), 512);       // the floor
  EXPECT_EQ(ops::linear_cross_entropy_chunk(1 << 20, 8192, 128256), 65536);  // Liger's rule
  EXPECT_EQ(ops::linear_cross_entropy_chunk(37, 24, 1001), 37);
  EXPECT_EQ(ops::linear_cross_entropy_chunk(100, 4096, 1000), 100);
  // The GPU kernel's bf16 logits alone: twice the rows for the same 256 MiB.
  EXPECT_EQ(ops::linear_cross_entropy_chunk(8192, 2048, 128256, {}, 2), 1024);
  EXPECT_THROW(ops::linear_cross_entropy_chunk(10, 10, 10, {}, 0), InvalidArgument);
  LinearCrossEntropyOptions o;
  o.chunk_tokens = -1;
  EXPECT_THROW(ops::linear_cross_entropy_chunk(10, 10, 10, o), InvalidArgument);
}

TEST(LinearCrossEntropy, AScaledBackwardScalesTheGradients) {
  auto c = make_case(20, 16, 50);
  auto want = unfused(c);
  auto h = c.hidden.detach().clone().requires_grad_();
  auto w = c.weight.detach().clone().requires_grad_();
  (linear_cross_entropy(h, w, c.targets) * 0.25).backward();
  EXPECT_LT(rel_diff(h.grad(), want.grad_h * 0.25), kFp32);
  EXPECT_LT(rel_diff(w.grad(), want.grad_w * 0.25), kFp32);
}

TEST(LinearCrossEntropy, NoCountedTargetIsAZeroLossWithZeroGradients) {
  auto c = make_case(9, 8, 30);
  c.targets.fill_(-100);
  auto got = fused(c);
  EXPECT_EQ(got.loss.item<float>(), 0.0f);
  EXPECT_EQ(got.grad_h.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(got.grad_w.abs().max().item<float>(), 0.0f);
}

TEST(LinearCrossEntropy, AFrozenWeightGetsNoGradient) {
  auto c = make_case(12, 8, 40);
  c.weight.requires_grad_(false);
  auto want = unfused(c);
  auto got = fused(c);
  EXPECT_FALSE(got.grad_w.defined());
  EXPECT_LT(rel_diff(got.loss, want.loss), kFp32);
  EXPECT_LT(rel_diff(got.grad_h, want.grad_h), kFp32);
}

TEST(LinearCrossEntropy, Bf16WithinItsRounding) {
  auto c = make_case(64, 32, 777, at::kBFloat16);
  auto want = unfused(c);
  LinearCrossEntropyOptions o;
  o.chunk_tokens = 16;
  auto got = fused(c, o);
  EXPECT_EQ(got.grad_h.scalar_type(), at::kBFloat16);
  EXPECT_EQ(got.grad_w.scalar_type(), at::kBFloat16);
  // The logits are the same bf16 GEMM's rows; the gradients' GEMMs differ in how they are cut
  // into chunks, and the weight's sums its chunks in fp32: within bf16's 2^-8 of the largest.
  EXPECT_LT(rel_diff(got.loss, want.loss), 1e-5);
  EXPECT_LT(rel_diff(got.grad_h, want.grad_h), 1e-2);
  EXPECT_LT(rel_diff(got.grad_w, want.grad_w), 1e-2);
}

TEST(LinearCrossEntropy, BadInputIsRefusedByName) {
  auto c = make_case(6, 8, 10);
  auto expect = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
      ADD_FAILURE() << "expected InvalidArgument with " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect([&] { linear_cross_entropy(c.hidden, c.weight.narrow(1, 0, 4), c.targets); },
         "expected hidden [N, d], weight [V, d] and targets [N]");
  expect([&] { linear_cross_entropy(c.hidden, c.weight.to(at::kDouble), c.targets); },
         "a weight of their dtype");
  auto bad = c.targets.clone();
  bad[0] = 10;
  expect([&] { linear_cross_entropy(c.hidden, c.weight, bad); }, "outside the vocabulary [0, 10)");
}

// Vocabulary-parallel on thread ranks: each rank holds tp::chunk_of's rows of the weight; the
// loss is the whole vocabulary's on every rank, the hidden states' gradients summed over the
// ranks are the whole one's, and each rank's weight gradient is the whole one's rows.
TEST(LinearCrossEntropy, VocabularyParallelEqualsTheWholeVocabulary) {
  const int64_t vocab = 1001;
  auto c = make_case(29, 16, vocab);
  auto want = unfused(c);
  for (int world : {2, 3}) {
    const auto got = lce::vocabulary_parallel(c, vocab, world, /*chunk_tokens=*/4);
    auto grad_h = torch::zeros_like(want.grad_h);
    for (int r = 0; r < world; ++r) {
      const auto mine = tp::chunk_of(vocab, world, r);
      EXPECT_LT(rel_diff(got[r].loss, want.loss), kFp32) << "world " << world << " rank " << r;
      EXPECT_LT(rel_diff(got[r].grad_w, want.grad_w.narrow(0, mine.offset, mine.length)), kFp32)
          << "world " << world << " rank " << r;
      grad_h += got[r].grad_h;
    }
    EXPECT_LT(rel_diff(grad_h, want.grad_h), kFp32) << "world " << world;
  }
}

}  // namespace
}  // namespace fsdp::testing
