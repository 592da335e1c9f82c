// The backbone: fully_shard at world sizes 1-4 (thread ranks) trains to the same losses and
// parameters as a single process without FSDP.
#include <gtest/gtest.h>

#include "train_harness.h"

namespace fsdp::testing {
namespace {

// Per-tensor normalised error (max |a - b| / max |b|) and relative loss error, fp32 AdamW,
// 10 steps. Differences come only from summation order (local means averaged over ranks).
constexpr double kFp32Tolerance = 1e-5;

class Fp32Parity : public ::testing::TestWithParam<int> {};

TEST_P(Fp32Parity, MatchesSingleProcess) {
  TrainSpec spec;
  auto want = train_reference(spec, /*slices=*/GetParam());
  ASSERT_LT(want.losses.back(), want.losses.front()) << "the reference must learn something";
  LocalGroupOptions options;
  options.timeout = std::chrono::seconds(10);  // a hang fails the test instead of stalling CI
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() != 0) return;
        double loss_err = max_rel_loss_error(got, want);
        double param_err = max_rel_param_error(got, want);
        std::cout << "world " << pg->size() << ": loss rel err " << loss_err << ", param rel err "
                  << param_err << "\n";
        EXPECT_LT(loss_err, kFp32Tolerance);
        EXPECT_LT(param_err, kFp32Tolerance);
      },
      options);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Fp32Parity, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace fsdp::testing
