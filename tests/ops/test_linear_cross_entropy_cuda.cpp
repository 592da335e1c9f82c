// ops::linear_cross_entropy on the GPU (its cross-entropy kernel and its cuBLAS float32
// accumulation of the weight's gradient, where built) against the unfused head and loss on the
// same GPU (at::linear, then cross_entropy on float32 logits) and against the CPU: fp32 and
// bf16 and half, vocabularies that divide into 16-byte packs (4096, Llama 3's 128,256) and ones
// that do not (1001, and the chunk-level test's 1, 7, 100), chunks from one token to all,
// ignored targets, a frozen weight, more rows than the kernel's grid, and the vocabulary split
// over two thread ranks (its log-sum-exp given to the kernel). Skips without a GPU, fails under
// FSDP_REQUIRE_GPU=1, where the kernel must also be what ran.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "fsdp/ops/fused.h"
#include "fsdp/ops/linear_cross_entropy.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "ops/cross_entropy_chunk.h"
#include "ops/linear_cross_entropy_util.h"
#include "support/gpu.h"
#include "support/torch_api.h"

namespace fsdp::testing::lce_cuda_test {
namespace {

using lce::Case;
using lce::fused;
using lce::unfused;
using ops::linear_cross_entropy;
using ops::LinearCrossEntropyOptions;

// On the GPU, in `dtype`; about a fifth of the targets ignored.
Case make_case(int64_t n, int64_t d, int64_t v, at::ScalarType dtype) {
  torch::manual_seed(11);
  const auto opts = at::TensorOptions().device(at::kCUDA).dtype(dtype);
  auto targets = torch::randint(0, v, {n}, torch::kLong);
  targets.masked_fill_(torch::rand({n}) < 0.2, -100);
  return {(torch::randn({n, d}) * 2).to(opts),
          (torch::randn({v, d}) * 0.3).to(opts).requires_grad_(), targets.to(at::kCUDA)};
}

// fp32: the same sums in other orders (5e-6, as the CPU test). bf16 and half: cuBLAS may round
// a logit of a chunk's GEMM one step differently from the whole batch's (or the CPU's), and
// one such step in a target or maximum logit moves the loss by about 4e-5 of itself here, so
// 2e-4 (a wrong log-sum-exp is off by far more); the gradients within the dtype's rounding of
// differently cut GEMMs (bf16's 2^-8 of the largest element).
double loss_tolerance(at::ScalarType t) { return t == at::kFloat ? 5e-6 : 2e-4; }
double grad_tolerance(at::ScalarType t) { return t == at::kFloat ? 5e-6 : 1e-2; }

// Under FSDP_REQUIRE_GPU (the GPU check) the kernel must be what ran, not the ATen form.
void expect_the_kernel_runs(at::ScalarType dtype) {
  if (!gpu_required()) return;
  EXPECT_TRUE(ops::cuda_kernels_built());
  EXPECT_TRUE(ops::detail::chunk_kernel_runs_on(
      at::empty({2, 8}, at::TensorOptions().device(at::kCUDA).dtype(dtype))))
      << c10::toString(dtype);
}

TEST(LinearCrossEntropyCuda, EqualsTheUnfusedLossOnTheGpuAndTheCpu) {
  FSDP_SKIP_WITHOUT_GPU();
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    expect_the_kernel_runs(dtype);
    for (int64_t vocab : {1001, 4096}) {
      auto c = make_case(67, 48, vocab, dtype);
      const auto want = unfused(c);
      for (int64_t chunk : {0, 1, 7, 67}) {
        LinearCrossEntropyOptions o;
        o.chunk_tokens = chunk;
        const auto got = fused(c, o);
        const auto at = fmt::format("{} vocab {} chunk {}", c10::toString(dtype), vocab, chunk);
        EXPECT_EQ(got.grad_h.scalar_type(), dtype) << at;
        EXPECT_EQ(got.grad_w.scalar_type(), dtype) << at;
        EXPECT_LT(rel_diff(got.loss, want.loss), loss_tolerance(dtype)) << at;
        EXPECT_LT(rel_diff(got.grad_h, want.grad_h), grad_tolerance(dtype)) << at;
        EXPECT_LT(rel_diff(got.grad_w, want.grad_w), grad_tolerance(dtype)) << at;
      }
      if (dtype == at::kHalf) continue;  // half GEMMs on the CPU: not what this compares
      // The CPU's ATen form of the same chunks.
      Case cpu{c.hidden.cpu(), c.weight.cpu(), c.targets.cpu()};
      LinearCrossEntropyOptions o;
      o.chunk_tokens = 7;
      const auto on_cpu = fused(cpu, o), on_gpu = fused(c, o);
      EXPECT_LT(rel_diff(on_gpu.loss, on_cpu.loss), loss_tolerance(dtype)) << vocab;
      EXPECT_LT(rel_diff(on_gpu.grad_h, on_cpu.grad_h), grad_tolerance(dtype)) << vocab;
      EXPECT_LT(rel_diff(on_gpu.grad_w, on_cpu.grad_w), grad_tolerance(dtype)) << vocab;
    }
  }
}

// One chunk's cross-entropy on the GPU (the kernel, where built) against the same function on a
// CPU copy (its ATen form there): vocabularies smaller than a block's 256 threads, whole packs
// or not (1, 7, 8, 100, 4096), more rows than the kernel's grid of 2^18 blocks, fp32, bf16 and
// half, and the split-vocabulary form (log-sum-exp and target given; some targets held by
// "another rank", so no one-hot here).
TEST(LinearCrossEntropyCuda, ChunkKernelEqualsItsAtenForm) {
  FSDP_SKIP_WITHOUT_GPU();
  struct Shape {
    int64_t rows, vocab;
  };
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (auto [rows, vocab] :
         std::vector<Shape>{{9, 1}, {33, 7}, {33, 8}, {50, 100}, {40, 4096}, {(1 << 18) + 5, 8}}) {
      for (bool split : {false, true}) {
        torch::manual_seed(13);
        const auto logits = (torch::randn({rows, vocab}) * 3).to(dtype);
        ops::detail::ChunkRows cpu;
        cpu.index = torch::randint(0, vocab, {rows}, torch::kLong);
        cpu.counted = torch::rand({rows}) < 0.8;
        cpu.here = split ? cpu.counted & (torch::rand({rows}) < 0.5) : cpu.counted.clone();
        cpu.inv_count = cpu.counted.sum().clamp_min(1).to(at::kFloat).reciprocal();
        if (split) {  // as if a second rank held as much probability again
          cpu.lse = at::logsumexp(logits.to(at::kFloat), 1) + std::log(2.0f);
          cpu.target = torch::randn({rows});
        }
        auto to_gpu = [](const at::Tensor& t) { return t.defined() ? t.to(at::kCUDA) : t; };
        ops::detail::ChunkRows gpu{to_gpu(cpu.index),     to_gpu(cpu.here), to_gpu(cpu.counted),
                                   to_gpu(cpu.inv_count), to_gpu(cpu.lse),  to_gpu(cpu.target)};
        const auto want = ops::detail::chunk_cross_entropy(logits.clone(), cpu, true);
        const auto got = ops::detail::chunk_cross_entropy(logits.to(at::kCUDA), gpu, true);
        const auto at = fmt::format("{} rows {} vocab {}{}", c10::toString(dtype), rows, vocab,
                                    split ? " split" : "");
        EXPECT_EQ(got.grad.scalar_type(), dtype) << at;
        EXPECT_LT(rel_diff(got.loss_sum, want.loss_sum), 1e-5) << at;
        // Both round the same float32 gradient to the dtype, up to float32 summation order.
        EXPECT_LT(rel_diff(got.grad, want.grad), dtype == at::kFloat ? 1e-5 : 1e-2) << at;
        // The loss alone leaves the logits as they were.
        auto kept = logits.to(at::kCUDA);
        const auto loss_only = ops::detail::chunk_cross_entropy(kept, gpu, false);
        EXPECT_LT(rel_diff(loss_only.loss_sum, want.loss_sum), 1e-5) << at;
        EXPECT_TRUE(at::equal(kept.cpu(), logits)) << at;
      }
    }
  }
}

// What the kernel does beyond its ATen form: a row whose target is ignored is not read, so
// garbage there (NaN) reaches neither the loss nor that row's gradient; a NaN in a counted row
// makes its loss NaN, as ATen's.
TEST(LinearCrossEntropyCuda, ChunkKernelSkipsIgnoredRows) {
  FSDP_SKIP_WITHOUT_GPU();
  if (!ops::cuda_kernels_built()) GTEST_SKIP() << "built without the CUDA kernels";
  const auto opts = at::TensorOptions().device(at::kCUDA);
  auto logits = torch::randn({6, 64}, opts);
  ops::detail::ChunkRows r;
  r.index = torch::full({6}, 5, opts.dtype(at::kLong));
  r.counted = torch::tensor({true, false, true, true, true, true}, opts.dtype(at::kBool));
  r.here = r.counted.clone();
  r.inv_count = torch::full({}, 0.2f, opts);
  logits[1].fill_(std::numeric_limits<float>::quiet_NaN());
  const auto got = ops::detail::chunk_cross_entropy(logits, r, true);
  EXPECT_TRUE(std::isfinite(got.loss_sum.item<float>()));
  EXPECT_EQ(got.grad[1].abs().max().item<float>(), 0.0f);
  auto poisoned = torch::randn({6, 64}, opts);
  poisoned[2][7] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(
      std::isnan(ops::detail::chunk_cross_entropy(poisoned, r, false).loss_sum.item<float>()));
}

TEST(LinearCrossEntropyCuda, LlamasVocabularyInBf16) {
  FSDP_SKIP_WITHOUT_GPU();
  auto c = make_case(96, 64, 128256, at::kBFloat16);
  const auto want = unfused(c);
  LinearCrossEntropyOptions o;
  o.chunk_tokens = 32;
  const auto got = fused(c, o);
  EXPECT_LT(rel_diff(got.loss, want.loss), 2e-4);
  EXPECT_LT(rel_diff(got.grad_h, want.grad_h), 1e-2);
  EXPECT_LT(rel_diff(got.grad_w, want.grad_w), 1e-2);
  // The loss alone (no gradient wanted: the kernel's loss-only pass).
  torch::NoGradGuard no_grad;
  const auto loss = linear_cross_entropy(c.hidden, c.weight, c.targets, o);
  EXPECT_LT(rel_diff(loss, want.loss), 2e-4);
}

TEST(LinearCrossEntropyCuda, AFrozenWeightAndNoCountedTarget) {
  FSDP_SKIP_WITHOUT_GPU();
  auto c = make_case(20, 32, 4096, at::kBFloat16);
  const auto want = unfused(c);
  c.weight.requires_grad_(false);
  const auto frozen = fused(c);
  EXPECT_FALSE(frozen.grad_w.defined());
  EXPECT_LT(rel_diff(frozen.loss, want.loss), 2e-4);
  EXPECT_LT(rel_diff(frozen.grad_h, want.grad_h), 1e-2);
  c.targets.fill_(-100);
  const auto none = fused(c);
  EXPECT_EQ(none.loss.item<float>(), 0.0f);
  EXPECT_EQ(none.grad_h.abs().max().item<float>(), 0.0f);
  EXPECT_EQ(none.grad_w.abs().max().item<float>(), 0.0f);
}

TEST(LinearCrossEntropyCuda, VocabularyParallelEqualsTheWholeVocabulary) {
  FSDP_SKIP_WITHOUT_GPU();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t vocab = 1001;  // 501 and 500 rows: one rank's slice is not whole packs
    auto c = make_case(29, 16, vocab, dtype);
    const auto want = unfused(c);
    const int world = 2;
    const auto got = lce::vocabulary_parallel(c, vocab, world, /*chunk_tokens=*/4);
    auto grad_h = torch::zeros_like(want.grad_h, at::kFloat);
    for (int r = 0; r < world; ++r) {
      const auto mine = tp::chunk_of(vocab, world, r);
      EXPECT_LT(rel_diff(got[r].loss, want.loss), loss_tolerance(dtype)) << r;
      EXPECT_LT(rel_diff(got[r].grad_w, want.grad_w.narrow(0, mine.offset, mine.length)),
                grad_tolerance(dtype))
          << r;
      grad_h += got[r].grad_h.to(at::kFloat);
    }
    EXPECT_LT(rel_diff(grad_h, want.grad_h), grad_tolerance(dtype) * 2) << c10::toString(dtype);
  }
}

}  // namespace
}  // namespace fsdp::testing::lce_cuda_test
