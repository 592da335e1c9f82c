// The backbone: fully_shard at world sizes 1-4 (thread ranks) trains to the same losses and
// parameters as a single process without FSDP.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

class Fp32Parity : public ::testing::TestWithParam<int> {};

TEST_P(Fp32Parity, MatchesSingleProcess) {
  TrainSpec spec;
  auto want = train_reference(spec, /*slices=*/GetParam());
  auto full_batch = train_reference(spec, /*slices=*/1);
  ASSERT_LT(want.losses.back(), want.losses.front()) << "the reference must learn something";
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() != 0) return;
        expect_parity("fp32", pg->size(), got, want, kFp32Tolerance);
        // Against plain full-batch training the losses agree as well; parameters can drift
        // where AdamW normalises gradients that are zero up to rounding (attention key bias).
        EXPECT_LT(max_rel_loss_error(got, full_batch), kFp32Tolerance);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Fp32Parity, ::testing::Values(1, 2, 3, 4));

// Start-up without the full model: blocks sharded as they are built hold exactly the values of
// the unsharded model of the same seed, and each rank only its rows.
class StartupByBlock : public ::testing::TestWithParam<int> {};

TEST_P(StartupByBlock, SameValuesAsTheUnshardedModel) {
  TrainSpec spec;
  auto reference = build_model(spec);
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        TinyLM model{nullptr};
        auto root = build_sharded_by_block(spec, pg, model);
        EXPECT_EQ(root.memory_stats().sharded_param_bytes,
                  expected_shard_bytes(reference, pg->size(), pg->rank()));
        auto want = reference->named_parameters();
        for (const auto& item : model->named_parameters()) {
          auto full = gather_full(pg, item.value(), want[item.key()].size(0));
          EXPECT_TRUE(at::equal(full, want[item.key()])) << item.key();
        }
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, StartupByBlock, ::testing::Values(1, 2, 3, 4));

TEST(StartupByBlock, ParameterCountWithoutBuilding) {
  for (bool tied : {false, true}) {
    TrainSpec spec;
    spec.model.tie_embeddings = tied;
    spec.model.outputs = tied ? 0 : 3;
    int64_t n = 0;
    for (const auto& p : unique_parameters(*build_model(spec))) n += p.numel();
    EXPECT_EQ(fsdp::models::minillm::parameter_count(spec.model), n) << "tied " << tied;
  }
}

// bf16 parameters and compute, fp32 reduction, fp32 master shards: against a reference that
// applies the same casts by hand.
class MixedPrecisionParity : public ::testing::TestWithParam<int> {};

TEST_P(MixedPrecisionParity, MatchesReferenceWithSameCasts) {
  TrainSpec spec;
  spec.mp.param_dtype = at::kBFloat16;
  spec.mp.reduce_dtype = at::kFloat;
  auto want = train_reference(spec, /*slices=*/GetParam());
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() != 0) return;
        expect_parity("bf16/fp32", pg->size(), got, want, kFp32Tolerance);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MixedPrecisionParity, ::testing::Values(1, 2, 4));

TEST(ReshardAfterForward, TrueAndFalseGiveTheSameResults) {
  TrainSpec keep, free;
  keep.reshard_after_forward = false;
  free.reshard_after_forward = true;
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto a = train_sharded(keep, pg);
        auto b = train_sharded(free, pg);
        EXPECT_EQ(max_rel_loss_error(a, b), 0.0);
        EXPECT_EQ(max_rel_param_error(a, b), 0.0);
      },
      test_options());
}

// A tied embedding and output head (one tensor, two names) is one sharded parameter: uneven
// rows (vocab 1001) at every world size, the same losses and parameters as one process.
class TiedEmbeddings : public ::testing::TestWithParam<int> {};

TEST_P(TiedEmbeddings, MatchSingleProcess) {
  TrainSpec spec;
  spec.model.outputs = 0;
  spec.model.tie_embeddings = true;
  spec.steps = 6;
  auto want = train_reference(spec, /*slices=*/GetParam());
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() == 0) expect_parity("tied fp32", pg->size(), got, want, kFp32Tolerance);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Worlds, TiedEmbeddings, ::testing::Values(1, 2, 3, 4));

TEST(TiedEmbeddings, AreOneParameterOfTheUnit) {
  TrainSpec spec;
  spec.model.outputs = 0;
  spec.model.tie_embeddings = true;
  auto model = build_model(spec);
  EXPECT_EQ(model->named_parameters().size(), unique_parameters(*model).size() + 1);
  auto pg = make_local_groups(1).front();
  auto root = shard_model(model, pg);
  EXPECT_EQ(root.parameters().size(), unique_parameters(*model).size());
  EXPECT_TRUE(root->embed->weight.is_same(root->tied_head->named_parameters()["weight"]));
}

TEST(TiedEmbeddings, SharedBetweenTwoUnitsIsRejectedNamingBoth) {
  TrainSpec spec;
  spec.model.outputs = 0;
  spec.model.tie_embeddings = true;
  auto model = build_model(spec);
  auto pg = make_local_groups(1).front();
  // The embedding as a unit of its own while the root's head reads the same tensor.
  auto embed = model->embed;
  fully_shard(embed, pg);
  expect_error_containing<InvalidArgument>([&] { fully_shard(model, pg); },
                                           "parameter 'head.weight'");
  expect_error_containing<InvalidArgument>([&] { fully_shard(model, pg); },
                                           "inner fully_shard unit");
}

TEST(FrozenParameters, StayUnchangedAndTheRestMatches) {
  TrainSpec spec;
  spec.edit_model = [](TinyLM& m) {
    m->layers[0]->fc1->weight.set_requires_grad(false);
    m->layers[0]->norm1->weight.set_requires_grad(false);
    for (auto& p : m->layers[1]->parameters()) p.set_requires_grad(false);  // a whole unit
  };
  auto want = train_reference(spec, 2);
  auto initial = build_model(spec);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() != 0) return;
        EXPECT_LT(max_rel_loss_error(got, want), kFp32Tolerance);
        EXPECT_LT(max_rel_param_error(got, want), kFp32Tolerance);
        size_t frozen_seen = 0;
        for (const auto& [name, value] : got.params) {
          if (name == "layers.0.ffn.0.weight" || name == "layers.0.norm1.weight" ||
              name.rfind("layers.1.", 0) == 0) {
            EXPECT_TRUE(at::equal(value, initial->named_parameters()[name])) << name;
            ++frozen_seen;
          }
        }
        EXPECT_EQ(frozen_seen, 2 + initial->layers[1]->parameters().size());
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
