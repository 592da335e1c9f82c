// fully_shard over real MPI processes (ctest runs it under mpiexec -n 2, 3, 4): the same
// equivalence as the thread-rank tests, each process computing the reference itself.
#include <gtest/gtest.h>

#include <limits>

#include "clip_grad_check.h"
#include "support/multi_process_main.h"
#include "train_harness.h"

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
