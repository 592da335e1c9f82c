// Gradient accumulation without communication (Unit::set_requires_gradient_sync): micro-batches
// with sync off keep unsharded gradients and reduce once, matching one process and matching
// accumulation that reduces every micro-batch; the counts and memory that implies; and the
// switch refused mid-backward.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

// The gradients one process gets for a global batch: the mean over `slices` equal slices.
std::vector<at::Tensor> reference_grads(const TrainSpec& spec, int slices) {
  auto model = build_model(spec);
  auto [tokens, targets] = global_batch(spec, 0);
  const int64_t n = spec.batch / slices;
  for (int s = 0; s < slices; ++s) {
    (loss_of(model(tokens.narrow(0, s * n, n)), targets.narrow(0, s * n, n),
             spec.model.output_size()) /
     slices)
        .backward();
  }
  std::vector<at::Tensor> grads;
  for (const auto& p : unique_parameters(*model)) grads.push_back(p.grad());
  return grads;
}

// World size and micro-batches per rank: the global batch of 12 splits into world x micro.
class NoSyncAccumulation : public ::testing::TestWithParam<std::pair<int, int>> {};

// One step's reduced gradients, gathered: those of one process within float rounding.
TEST_P(NoSyncAccumulation, GradientsMatchSingleProcess) {
  const auto [world, micro] = GetParam();
  TrainSpec spec;
  auto want = reference_grads(spec, world * micro);
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        std::vector<int64_t> dim0;
        for (const auto& p : unique_parameters(*model)) dim0.push_back(p.size(0));
        auto root = shard_model(model, pg);
        auto [tokens, targets] = global_batch(spec, 0);
        const int64_t local = spec.batch / world, n = local / micro;
        for (int k = 0; k < micro; ++k) {
          root.set_requires_gradient_sync(k + 1 == micro);
          auto x = rank_slice(tokens, pg, local).narrow(0, k * n, n);
          auto y = rank_slice(targets, pg, local).narrow(0, k * n, n);
          (loss_of(root(x), y, spec.model.output_size()) / micro).backward();
        }
        auto params = unique_parameters(*model);
        for (size_t i = 0; i < params.size(); ++i) {
          auto got = gather_full(pg, params[i].grad(), dim0[i]);
          double scale = want[i].abs().max().item<double>();
          EXPECT_LT((got - want[i]).abs().max().item<double>(), 1e-6 * scale + 1e-12) << i;
        }
      },
      test_options());
}

// Training: the losses agree to float rounding. Parameters are compared more loosely: the
// accumulation orders differ, and AdamW turns rounding-sized differences in near-zero
// gradient elements (embedding rows of tokens a step barely saw) into differences of up to
// lr times the step count there; measured up to 1.1e-4 of the tensor's largest value.
// The attention bias is frozen (freeze_attention_bias says why).
constexpr double kAdamWOrderTolerance = 5e-4;

TEST_P(NoSyncAccumulation, TrainsLikeSingleProcessAndSyncEveryMicroBatch) {
  const auto [world, micro] = GetParam();
  TrainSpec spec;
  spec.steps = 6;
  spec.micro_batches = micro;
  spec.edit_model = freeze_attention_bias;
  auto want = train_reference(spec, /*slices=*/world * micro);
  TrainSpec every = spec;
  every.sync_every_micro_batch = true;
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        auto synced = train_sharded(every, pg);
        if (pg->rank() != 0) return;
        EXPECT_LT(max_rel_loss_error(got, want), kFp32Tolerance);
        EXPECT_LT(max_rel_loss_error(got, synced), kFp32Tolerance);
        expect_parity("no-sync accumulation", world, got, want, kAdamWOrderTolerance);
        expect_parity("no-sync vs sync every micro-batch", world, got, synced,
                      kAdamWOrderTolerance);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldsAndMicroBatches, NoSyncAccumulation,
                         ::testing::Values(std::pair{1, 4}, std::pair{2, 2}, std::pair{3, 2},
                                           std::pair{4, 3}));

TEST(NoSyncAccumulation, MixedPrecisionAccumulatesInReduceDtype) {
  TrainSpec spec;
  spec.steps = 4;
  spec.micro_batches = 2;
  spec.edit_model = freeze_attention_bias;
  spec.mp.param_dtype = at::kBFloat16;
  spec.mp.reduce_dtype = at::kFloat;
  TrainSpec every = spec;
  every.sync_every_micro_batch = true;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        auto synced = train_sharded(every, pg);
        // bf16 gradients summed in fp32 either way: only the order of additions differs.
        if (pg->rank() == 0) expect_parity("bf16 no-sync vs sync", 2, got, synced, 1e-4);
      },
      test_options());
}

// Three micro-batches, sync off for the first two, on rank 7 of 8 (the fake group): gathers
// every micro-batch, one reduce-scatter per unit per step, and the unsharded gradients held
// in between are the full gradients of the whole model.
TEST(NoSyncAccumulation, OneReduceScatterPerUnitPerStepAndItsMemory) {
  TrainSpec spec;
  auto pg = make_fake_group(/*rank=*/7, /*world_size=*/8);
  auto model = build_model(spec);
  int64_t full_bytes = 0;
  for (const auto& p : unique_parameters(*model)) full_bytes += p.nbytes();
  auto root = shard_model(model, pg);
  const int64_t units = static_cast<int64_t>(model->layers.size()) + 1;
  auto [tokens, targets] = global_batch(spec, 0);
  pg->reset_stats();
  for (int k = 0; k < 3; ++k) {
    root.set_requires_gradient_sync(k == 2);
    loss_of(root(tokens.narrow(0, k, 1)), targets.narrow(0, k, 1), spec.model.output_size())
        .backward();
    auto m = root.memory_stats();
    if (k < 2) {
      EXPECT_EQ(m.unsharded_grad_bytes, full_bytes) << "micro-batch " << k;
      EXPECT_EQ(m.sharded_grad_bytes, 0);
      EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), 0);
    } else {
      EXPECT_EQ(m.unsharded_grad_bytes, 0);
      EXPECT_EQ(m.sharded_grad_bytes, m.sharded_param_bytes);
    }
    EXPECT_EQ(m.tree.full_param_bytes, 0);
  }
  // Forward gathers every unit; backward every unit but the root, which keeps its parameters.
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 3 * (units + units - 1));
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), units);
}

// Without recurse only the unit itself stops syncing: the blocks still reduce.
TEST(NoSyncAccumulation, WithoutRecurseOnlyTheUnit) {
  TrainSpec spec;
  auto pg = make_fake_group(0, 2);
  auto model = build_model(spec);
  auto root = shard_model(model, pg);
  auto [tokens, targets] = global_batch(spec, 0);
  root.set_requires_gradient_sync(false, /*recurse=*/false);
  pg->reset_stats();
  loss_of(root(tokens.narrow(0, 0, 2)), targets.narrow(0, 0, 2), spec.model.output_size())
      .backward();
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter),
            static_cast<int64_t>(model->layers.size()));
}

// The switch from a hook while the backward runs: refused, and that backward still reduces.
TEST(NoSyncAccumulation, ToggledMidBackwardIsRejected) {
  TrainSpec spec;
  auto pg = make_fake_group(0, 2);
  auto model = build_model(spec);
  auto root = shard_model(model, pg);
  auto [tokens, targets] = global_batch(spec, 0);
  auto logits = root(tokens.narrow(0, 0, 2));
  std::string error;
  // Registered after the root's own hook on its output: runs inside the tree's backward.
  logits.register_hook([&](const at::Tensor& g) {
    try {
      root.set_requires_gradient_sync(false);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
    return g;
  });
  pg->reset_stats();
  loss_of(logits, targets.narrow(0, 0, 2), spec.model.output_size()).backward();
  EXPECT_NE(error.find("while a backward of its tree is running"), std::string::npos) << error;
  EXPECT_NE(error.find("unit '(root)'"), std::string::npos) << error;
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter),
            static_cast<int64_t>(model->layers.size()) + 1);
  EXPECT_EQ(root.memory_stats().unsharded_grad_bytes, 0);
}

}  // namespace
}  // namespace fsdp::testing
