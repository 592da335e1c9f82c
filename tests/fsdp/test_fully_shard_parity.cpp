// The backbone: fully_shard at world sizes 1-4 (thread ranks) trains to the same losses and
// parameters as a single process without FSDP.
#include <gtest/gtest.h>

#include "train_harness.h"

namespace fsdp::testing {
namespace {

// Relative loss error and per-tensor normalised parameter error (max |a - b| / max |b|) after
// 10 AdamW steps, fp32. The reference accumulates the gradients of the N slices of each global
// batch in one process, so only the order of float additions may differ.
constexpr double kFp32Tolerance = 1e-5;

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
