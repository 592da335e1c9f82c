// fully_shard on a GPU: NCCL at world size 1 against a plain libtorch reference on the same
// GPU, and the fake group playing rank 0 of 4 and 8 on CUDA tensors for memory and counts.
// Built wherever the NCCL backend is; skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "support/gpu.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FSDP_SKIP_WITHOUT_GPU();
    // CUDA's embedding backward sums with atomics unless deterministic algorithms are on.
    at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  }
  TrainSpec spec() const {
    TrainSpec s;
    s.device = c10::Device(c10::kCUDA, 0);
    return s;
  }
};

TEST_F(CudaTest, NcclWorldOneFp32MatchesPlainLibtorch) {
  auto s = spec();
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  auto want = train_reference(s, 1);
  auto got = train_sharded(s, pg);
  std::cout << "cuda fp32: loss rel err " << max_rel_loss_error(got, want) << ", param rel err "
            << max_rel_param_error(got, want) << "\n";
  EXPECT_LT(max_rel_loss_error(got, want), 1e-5);
  EXPECT_LT(max_rel_param_error(got, want), 1e-5);
}

TEST_F(CudaTest, NcclWorldOneBf16MatchesReferenceWithSameCasts) {
  auto s = spec();
  s.mp.param_dtype = at::kBFloat16;
  s.mp.reduce_dtype = at::kFloat;
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  auto want = train_reference(s, 1);
  pg->reset_stats();
  auto got = train_sharded(s, pg);
  double loss_err = max_rel_loss_error(got, want), param_err = max_rel_param_error(got, want);
  std::cout << "cuda bf16/fp32: loss rel err " << loss_err << ", param rel err " << param_err
            << "\n";
  // bf16 changes the dtype, so gathers and reductions run (answered locally: one rank).
  EXPECT_GT(pg->stats().count(CollectiveKind::kAllGather), 0);
  EXPECT_LT(loss_err, 1e-3);
  EXPECT_LT(param_err, 1e-3);

  // The same with every collective held back 20 ms on its stream (FSDP_DEBUG_COMM_DELAY_MS):
  // a stream wait missing anywhere (a copy-out reading the buffer before the all-gather wrote
  // it, a buffer reused before the reduce-scatter read it) would change the numbers.
  // Through NCCL itself (a one-rank group answers locally otherwise, with nothing to delay);
  // the runtime reduces one rank with a sum, which NCCL gets right on one rank.
  setenv("FSDP_DEBUG_COMM_DELAY_MS", "20", 1);
  auto delayed_pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  unsetenv("FSDP_DEBUG_COMM_DELAY_MS");
  delayed_pg->set_one_rank_through_engine(true);
  auto delayed = train_sharded(s, delayed_pg);
  EXPECT_EQ(delayed.losses, got.losses);
  EXPECT_EQ(max_rel_param_error(delayed, got), 0.0);
}

// The reduce dtype bf16 (item 7): NCCL reduces in bf16, and the counters count bf16 bytes.
TEST_F(CudaTest, NcclWorldOneBf16ReductionCountsBf16Bytes) {
  auto s = spec();
  s.steps = 2;
  s.mp.param_dtype = at::kBFloat16;
  s.mp.reduce_dtype = at::kBFloat16;
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  auto model = build_model(s);
  int64_t params = 0;
  for (const auto& p : unique_parameters(*model)) params += p.numel();
  pg->reset_stats();
  auto got = train_sharded(s, pg);
  // World 1: every gradient element is reduced once per step, two bytes each.
  EXPECT_EQ(pg->stats().bytes_of(CollectiveKind::kReduceScatter), s.steps * params * 2);
  for (double loss : got.losses) EXPECT_TRUE(std::isfinite(loss));
}

// CPU offload on a GPU (FSDP2's CPUOffloadPolicy): the shards, so their gradients and AdamW's
// state, are pinned host tensors; the unit computes on the GPU. The training equals the one
// without offload to rounding (the optimizer then runs the CPU's fused kernel, not CUDA's).
TEST_F(CudaTest, OffloadKeepsShardsPinnedOnTheHostAndTrainsTheSame) {
  auto s = spec();
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  auto want = train_sharded(s, pg);
  s.offload = CPUOffloadPolicy{};
  auto got = train_sharded(s, pg);
  std::cout << "cuda offload: loss rel err " << max_rel_loss_error(got, want) << ", param rel err "
            << max_rel_param_error(got, want) << "\n";
  EXPECT_LT(max_rel_loss_error(got, want), 1e-5);
  EXPECT_LT(max_rel_param_error(got, want), 1e-5);

  auto model = build_model(s);
  auto root = shard_model(model, pg, s);
  FusedAdamW opt(root.parameters(), torch::optim::AdamWOptions(s.lr));
  auto [tokens, targets] = global_batch(s, 0);
  auto logits = root(tokens.to(s.device));
  EXPECT_TRUE(logits.is_cuda());
  loss_of(logits, targets.to(s.device), s.model.output_size()).backward();
  opt.step();
  for (const auto& p : root.parameters()) {
    EXPECT_TRUE(p.is_cpu() && p.is_pinned()) << "a shard not in pinned host memory";
    ASSERT_TRUE(p.grad().defined());
    EXPECT_TRUE(p.grad().is_cpu()) << "a gradient shard not on the host";
    auto& state =
        static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    EXPECT_TRUE(state.exp_avg().is_cpu() && state.exp_avg_sq().is_cpu());
  }
}

// Optimizer-state offload alone: the parameters stay on the GPU, AdamW's moments are host
// tensors, and the update equals CUDA's fused AdamW to rounding.
TEST_F(CudaTest, OptimizerStateOffloadMatchesTheDeviceStep) {
  auto s = spec();
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  std::vector<std::vector<at::Tensor>> finals;
  for (bool offload : {false, true}) {
    auto model = build_model(s);
    auto root = shard_model(model, pg, s);
    FusedAdamW opt(root.parameters(), torch::optim::AdamWOptions(s.lr));
    opt.set_state_offload(offload);
    for (int step = 0; step < 3; ++step) {
      auto [tokens, targets] = global_batch(s, step);
      opt.zero_grad();
      loss_of(root(tokens.to(s.device)), targets.to(s.device), s.model.output_size()).backward();
      opt.step();
    }
    std::vector<at::Tensor> params;
    for (const auto& p : root.parameters()) {
      EXPECT_TRUE(p.is_cuda()) << "the parameters stay on the device";
      auto& state =
          static_cast<torch::optim::AdamWParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
      EXPECT_EQ(state.exp_avg().is_cpu(), offload);
      params.push_back(p.detach().cpu());
    }
    finals.push_back(params);
  }
  for (size_t i = 0; i < finals[0].size(); ++i) {
    EXPECT_TRUE(at::allclose(finals[1][i], finals[0][i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

class FakeCudaWorld : public CudaTest, public ::testing::WithParamInterface<int> {};

TEST_P(FakeCudaWorld, MemoryAndCountsOfRankZero) {
  const int world = GetParam();
  auto s = spec();
  s.mp.param_dtype = at::kBFloat16;
  s.mp.reduce_dtype = at::kFloat;
  auto pg = make_fake_group(0, world, s.device);
  auto model = build_model(s);
  const int64_t expected = expected_shard_bytes(model, world, /*rank=*/0);
  FullyShardOptions opts{s.mp, std::nullopt};
  auto root = shard_model(model, pg, opts);
  auto [tokens, targets] = global_batch(s, 0);
  pg->reset_stats();
  auto logits = root(tokens.narrow(0, 0, 2).to(s.device));
  torch::nn::functional::cross_entropy(logits.reshape({-1, s.model.output_size()}).to(at::kFloat),
                                       targets.narrow(0, 0, 2).reshape(-1).to(s.device))
      .backward();
  const int64_t n = static_cast<int64_t>(model->layers.size());
  EXPECT_EQ(root.memory_stats().sharded_param_bytes, expected);
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 2 * n + 1);  // root kept
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), n + 1);
  EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(Worlds, FakeCudaWorld, ::testing::Values(4, 8));

}  // namespace
}  // namespace fsdp::testing
