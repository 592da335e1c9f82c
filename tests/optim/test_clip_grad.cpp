// fsdp::clip_grad_norm_ on sharded gradients equals torch::nn::utils::clip_grad_norm_ on the
// unsharded model: the same total norm and the same clipped gradients, at worlds 1-4 on thread
// ranks, for p = 2, 1 and infinity; bad arguments fail before any gradient changes.
#include <gtest/gtest.h>

#include <limits>

#include "optim/clip_grad_check.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Case {
  int world;
  double norm_type;
};

class ClipGrad : public ::testing::TestWithParam<Case> {};

TEST_P(ClipGrad, MatchesLibtorchOnTheUnshardedModel) {
  const auto [world, p] = GetParam();
  run_local_ranks(
      world, [p = p](const ProcessGroupPtr& pg) { expect_clip_grad_matches_libtorch(pg, p); },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(WorldsAndNorms, ClipGrad,
                         ::testing::Values(Case{1, 2.0}, Case{2, 2.0}, Case{3, 2.0}, Case{4, 2.0},
                                           Case{2, 1.0}, Case{4, 1.0}, Case{2, kInf},
                                           Case{4, kInf}));

TEST(ClipGradErrors, RejectBadArgumentsBeforeTouchingGradients) {
  auto pg = make_local_groups(1).front();
  auto w = torch::ones({3}, torch::requires_grad());
  w.mutable_grad() = torch::full({3}, 5.0);
  for (double bad : {0.0, -1.0, std::nan(""), kInf}) {
    expect_error_containing<InvalidArgument>([&] { clip_grad_norm_({w}, bad, pg); },
                                             "max_norm must be a positive finite number");
  }
  expect_error_containing<InvalidArgument>([&] { clip_grad_norm_({w}, 1.0, pg, 0.0); },
                                           "norm_type must be positive");
  EXPECT_TRUE(at::equal(w.grad(), torch::full({3}, 5.0)));
  w.mutable_grad() = torch::full({3}, std::nan(""));
  expect_error_containing<Error>([&] { clip_grad_norm_({w}, 1.0, pg, 2.0, true); },
                                 "cannot be clipped");
}

}  // namespace
}  // namespace fsdp::testing
