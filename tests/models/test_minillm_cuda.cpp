// MiniLLM on a GPU with fsdp's CUDA kernels: its norms take the kernels (the first one alone,
// the second fused with the residual add before it), its attention runs batch first, and the
// model keeps its numbers. The norm is checked alone against PyTorch's GPU torch::rms_norm with
// its default eps on inputs of about 1e-3, where eps is about a tenth of mean(x^2): a wrong eps
// (bf16's own epsilon instead of float's) is far above the bound there. The whole model is
// checked against the same weights in float64 on the same GPU (a dtype the kernels do not take,
// so it runs PyTorch's ops): a lost residual, a norm with the wrong weight or q, k, v taken
// wrong show up far above the bound in float32.
// Skips without a GPU, or where the kernels do not run (FSDP_CUDA_KERNELS=0, a GPU older than
// sm_80); fails under FSDP_REQUIRE_GPU=1 in a build without them.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "fsdp/models/minillm.h"
#include "fsdp/ops/fused.h"
#include "support/gpu.h"
#include "support/tensor_compare.h"
#include "support/torch_api.h"

namespace fsdp::testing::minillm_cuda_test {
namespace {

namespace mm = fsdp::models::minillm;

mm::Config small_config() {
  mm::Config c;
  c.vocab = 300;
  c.dim = 192;  // not a multiple of the kernels' block
  c.layers = 2;
  c.heads = 4;
  return c;
}

TEST(MiniLLMCuda, GpuPathTakesTheKernelsAndKeepsTheModelsNumbers) {
  FSDP_SKIP_WITHOUT_GPU();
  if (!ops::cuda_kernels_built()) {
    if (gpu_required()) FAIL() << "FSDP_REQUIRE_GPU=1 but this build has no CUDA kernels";
    GTEST_SKIP() << "built without the CUDA kernels";
  }
  if (!ops::cuda_kernels_run_on(at::empty({1}, at::Device(at::kCUDA, 0)))) {
    GTEST_SKIP() << "the kernels do not run on this GPU or are turned off (FSDP_CUDA_KERNELS=0)";
  }
  const auto c = small_config();
  // float32 to the float64 model's rounding; bf16 within what its roundings of the activations
  // (2^-8 each) add up to over two blocks, relative to the largest value of each tensor.
  for (auto [dtype, tol] : {std::pair{at::kFloat, 1e-4}, std::pair{at::kBFloat16, 6e-2}}) {
    torch::manual_seed(3);
    mm::MiniLLM model(c), reference(c);
    {
      torch::NoGradGuard no_grad;
      auto from = model->named_parameters(), to = reference->named_parameters();
      for (const auto& p : from) to[p.key()].copy_(p.value());
    }
    model->to(at::Device(at::kCUDA, 0), dtype);
    reference->to(at::Device(at::kCUDA, 0), at::kDouble);
    const auto tokens = torch::randint(c.vocab, {3, 41}).to(at::kCUDA);
    const auto targets = torch::randint(c.vocab, {3, 41}).to(at::kCUDA);

    // The kernels are what the norms ran: their autograd nodes, not torch::rms_norm's.
    const auto x = torch::randn({3, 41, c.dim}).to(at::Device(at::kCUDA, 0), dtype);
    const auto normed = model->layers[0]->norm1(x.requires_grad_());
    const std::string node = normed.grad_fn() ? normed.grad_fn()->name() : "(none)";
    EXPECT_NE(node.find("RmsNormFunction"), std::string::npos) << node;
    // The batch-first attention: its output is contiguous (the sequence-first steps' is a
    // transposed view at batch 3).
    EXPECT_TRUE(model->layers[0]->attn(normed).is_contiguous());
    const auto block_out = model->layers[0]->forward(x);
    bool fused_add = false;  // add_rms_norm's node is in the block's graph
    std::vector<torch::autograd::Node*> todo{block_out.grad_fn().get()};
    for (size_t i = 0; i < todo.size() && i < 200; ++i) {
      if (todo[i] == nullptr) continue;
      fused_add |= todo[i]->name().find("AddRmsNormFunction") != std::string::npos;
      for (const auto& e : todo[i]->next_edges()) todo.push_back(e.function.get());
    }
    EXPECT_TRUE(fused_add) << "the block's residual add and norm2 did not run as one kernel";

    // The norm alone against PyTorch's, eps-sensitive inputs: within two of the dtype's steps.
    {
      torch::NoGradGuard no_grad;
      const auto small = torch::randn({5, 7, c.dim}).to(x.options()) * 1e-3;
      const auto& w = model->layers[0]->norm1->weight;
      const auto mine = model->layers[0]->norm1(small);
      const auto torchs = torch::rms_norm(small, {c.dim}, w, /*eps=*/std::nullopt);
      EXPECT_LT(rel_diff(mine, torchs), dtype == at::kFloat ? 1e-5 : 1.6e-2)
          << c10::toString(dtype) << ": the norm's eps is not torch::rms_norm's default";
    }

    auto loss_of = [&](mm::MiniLLM& m) {
      const auto logits = m->forward(tokens);
      return torch::nn::functional::cross_entropy(logits.reshape({-1, c.vocab}).to(at::kFloat),
                                                  targets.reshape(-1));
    };
    const auto got = loss_of(model), want = loss_of(reference);
    got.backward();
    want.backward();
    const auto where = ::testing::Message() << c10::toString(dtype);
    EXPECT_LT(rel_diff(got, want), tol) << where;
    auto ref_params = reference->named_parameters();
    for (const auto& p : model->named_parameters()) {
      ASSERT_TRUE(p.value().grad().defined()) << where << " " << p.key();
      EXPECT_LT(rel_diff(p.value().grad(), ref_params[p.key()].grad()), tol)
          << where << " gradient of " << p.key();
    }
  }
}

}  // namespace
}  // namespace fsdp::testing::minillm_cuda_test
