// fully_shard over real MPI processes (ctest runs it under mpiexec -n 2, 3, 4): the same
// equivalence as the thread-rank tests, each process computing the reference itself.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>

#include "optim/clip_grad_check.h"
#include "runtime/edge_cases.h"
#include "support/multi_process_main.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

constexpr double kTolerance = 1e-5;

ProcessGroupPtr& world() {
  static ProcessGroupPtr pg;
  return pg;
}

TEST(FullyShardMpi, Fp32MatchesSingleProcess) {
  TrainSpec spec;
  auto want = train_reference(spec, world()->size());
  auto got = train_sharded(spec, world());
  expect_parity("mpi fp32", world()->size(), got, want, kTolerance);
}

TEST(FullyShardMpi, MixedPrecisionMatchesReferenceWithSameCasts) {
  TrainSpec spec;
  spec.mp.param_dtype = at::kBFloat16;
  spec.mp.reduce_dtype = at::kFloat;
  auto want = train_reference(spec, world()->size());
  auto got = train_sharded(spec, world());
  expect_parity("mpi bf16/fp32", world()->size(), got, want, kTolerance);
}

TEST(FullyShardMpi, ReshardAfterForwardFalseMatches) {
  TrainSpec keep;
  keep.reshard_after_forward = false;
  keep.steps = 4;
  TrainSpec free = keep;
  free.reshard_after_forward = true;
  auto a = train_sharded(keep, world());
  auto b = train_sharded(free, world());
  EXPECT_EQ(max_rel_param_error(a, b), 0.0);
}

TEST(FullyShardMpi, TiedEmbeddingsMatchSingleProcess) {
  TrainSpec spec;
  spec.model.outputs = 0;
  spec.model.tie_embeddings = true;
  spec.steps = 6;
  auto want = train_reference(spec, world()->size());
  auto got = train_sharded(spec, world());
  expect_parity("mpi tied fp32", world()->size(), got, want, kTolerance);
}

// Micro-batches with gradient sync off but the last: losses as one process's to float
// rounding, parameters within the AdamW amplification of a different summation order
// (test_grad_sync.cpp explains the 5e-4).
TEST(FullyShardMpi, NoSyncAccumulationMatchesSingleProcess) {
  TrainSpec spec;
  spec.steps = 6;
  spec.micro_batches = world()->size() == 4 ? 3 : 2;  // the global batch of 12 splits evenly
  spec.edit_model = freeze_attention_bias;
  auto want = train_reference(spec, world()->size() * spec.micro_batches);
  auto got = train_sharded(spec, world());
  EXPECT_LT(max_rel_loss_error(got, want), kTolerance);
  expect_parity("mpi no-sync accumulation", world()->size(), got, want, 5e-4);
}

// Checkpointed blocks, and a checkpointed root around them: identical to no checkpointing.
TEST(FullyShardMpi, ActivationCheckpointingIsIdenticalToWithout) {
  TrainSpec plain;
  plain.steps = 4;
  for (bool root : {false, true}) {
    TrainSpec checkpointed = plain;
    checkpointed.checkpoint_blocks = true;
    checkpointed.checkpoint_root = root;
    auto got = train_sharded(checkpointed, world());
    auto want = train_sharded(plain, world());
    EXPECT_EQ(max_rel_loss_error(got, want), 0.0) << "root checkpointed: " << root;
    EXPECT_EQ(max_rel_param_error(got, want), 0.0) << "root checkpointed: " << root;
  }
}

TEST(FullyShardMpi, StartupByBlockHasTheUnshardedModelsValues) {
  TrainSpec spec;
  auto reference = build_model(spec);
  TinyLM model{nullptr};
  auto root = build_sharded_by_block(spec, world(), model);
  auto want = reference->named_parameters();
  for (const auto& item : model->named_parameters()) {
    auto full = gather_full(world(), item.value(), want[item.key()].size(0));
    EXPECT_TRUE(at::equal(full, want[item.key()])) << item.key();
  }
}

TEST(FullyShardMpi, ClipGradNormMatchesLibtorchOnTheUnshardedModel) {
  for (double p : {2.0, 1.0, std::numeric_limits<double>::infinity()}) {
    expect_clip_grad_matches_libtorch(world(), p);
  }
}

// Hybrid sharding over real processes, every layout of the world (at 4: 1x4, 2x2, 4x1): the
// losses of a single process, the parameters within the tolerance of a reordered sum
// (test_hybrid_shard.cpp), bit-identical to plain FSDP with one replica, and
// the same on every replica; per step, one all-reduce per unit on the replicate group and
// none on the world group. ctest also runs this test over Gloo (scripts/launch.sh).
TEST(FullyShardMpi, HybridShardingEveryLayoutMatches) {
  TrainSpec spec;
  spec.edit_model = freeze_attention_bias;
  spec.steps = 6;
  const int n = world()->size();
  auto want = train_reference(spec, n);
  auto plain = train_sharded(spec, world());
  for (int replicas = 1; replicas <= n; ++replicas) {
    if (n % replicas != 0) continue;
    auto mesh = make_device_mesh(world(), replicas);
    world()->reset_stats();
    if (mesh.replicate) mesh.replicate->reset_stats();
    auto got = train_sharded(spec, mesh);
    const std::string label =
        fmt::format("{} hsdp {}x{}", world()->backend_name(), replicas, mesh.shards());
    // Only the flat layout sums in the plain order: MPI's and Gloo's all-reduce add the ranks'
    // values in an order of their own ((a + b) + (c + d) in recursive doubling), even at 4x1.
    const bool same_order = replicas == 1;
    // Gloo's reduce-scatter has its own order too (plain FSDP over Gloo: 4.2e-5 at 4 ranks).
    const bool reference_order = same_order && world()->backend() == Backend::kMpi;
    expect_parity(label, n, got, want, reference_order ? kTolerance : 1e-4);
    EXPECT_LT(max_rel_loss_error(got, want), kTolerance) << label;
    if (same_order) {
      EXPECT_EQ(max_rel_param_error(got, plain), 0.0) << label;
    }
    if (mesh.replicate) {
      // The world group carried only the harness's loss averages (one per step).
      EXPECT_EQ(world()->stats().count(CollectiveKind::kAllReduce), spec.steps) << label;
      EXPECT_EQ(world()->stats().count(CollectiveKind::kReduceScatter), 0) << label;
      const int64_t units = spec.model.layers + 1;
      EXPECT_EQ(mesh.replicate->stats().count(CollectiveKind::kAllReduce), units * spec.steps)
          << label;
      // Replicas agree bit for bit: compare this rank's parameters with replica 0's.
      for (const auto& [name, value] : got.params) {
        auto mine = value.clone();
        mesh.replicate->broadcast(mine, 0)->wait();
        EXPECT_TRUE(at::equal(mine, value)) << label << ": " << name;
      }
    }
  }
  auto error = [&](int replicas) {
    try {
      make_device_mesh(world(), replicas);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(
      error(n + 1).find(fmt::format("{} replicas do not divide a world of {} ranks", n + 1, n)),
      std::string::npos);
}

// The edge cases of tests/runtime/test_edges.cpp over MPI processes: zero_grad between
// forward and backward, freezing after fully_shard, and failed steps.
TEST(FullyShardMpi, ZeroGradBetweenForwardAndBackward) {
  for (bool none : {true, false}) {
    for (bool reshard : {true, false}) {
      EdgeSpec spec;
      spec.options.reshard_after_forward = reshard;
      const auto program = zero_grad_program(ZeroGradAt::kBetweenForwardAndBackward, none);
      expect_edge_parity("mpi zero_grad", spec, flat_mesh(world()), program,
                         reference_of(spec, program));
    }
  }
}

TEST(FullyShardMpi, FreezingAndUnfreezing) {
  EdgeSpec spec;
  spec.edit = [](EdgeNetImpl& net) { set_trainable(net, {"blocks.2."}, false); };
  const auto at_shard = freeze_program({"blocks.2."}, -1, 3);
  expect_edge_parity("mpi whole unit unfrozen", spec, flat_mesh(world()), at_shard,
                     reference_of(spec, at_shard));
  EdgeSpec later;
  later.batch = 24;  // two micro-batches on every rank
  const auto after = freeze_program({"head.", "blocks.0."}, 2, 4, 2);
  expect_edge_parity("mpi frozen after shard", later, flat_mesh(world()), after,
                     reference_of(later, after));
}

TEST(FullyShardMpi, FailedStepsLeaveATreeThatTrainsOn) {
  for (auto f : {Failure::kInnerForward, Failure::kRootForward, Failure::kBackwardHook,
                 Failure::kSkippedBackward}) {
    EdgeSpec spec;
    auto ref_probe = std::make_shared<Probe>();
    auto ref_clean = std::make_shared<bool>(true);
    const auto want =
        reference_of(spec, failure_program(f, 2, ref_probe, ref_clean, spec.blocks), ref_probe);
    auto probe = std::make_shared<Probe>();
    auto clean = std::make_shared<bool>(true);
    expect_edge_parity(failure_name(f), spec, flat_mesh(world()),
                       failure_program(f, 2, probe, clean, spec.blocks), want, probe);
    EXPECT_TRUE(*clean) << failure_name(f);
  }
}

}  // namespace
}  // namespace fsdp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  auto d = fsdp::init_from_env();
  fsdp::testing::world() = d.group;
  int rc = fsdp::testing::run_tests_on_every_rank(*d.group);
  fsdp::testing::world().reset();
  d.group.reset();
  return rc;
}
