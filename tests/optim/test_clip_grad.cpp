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

// Hybrid sharding (2 x 2): the params form over the whole world would count every shard once
// per replica (a norm sqrt(2) too large) and change the gradients by it: refused before any
// gradient changes, on every rank; over the mesh (its shard group) it equals the model form.
TEST(ClipGradErrors, HybridShardsOverTheWorldAreRefused) {
  TrainSpec spec;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, /*replicas=*/2);
        auto model = build_model(spec);
        auto root = shard_model(model, mesh, spec);
        auto [tokens, targets] = global_batch(spec, 0);
        const int64_t local = tokens.size(0) / pg->size();
        loss_of(root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                spec.model.output_size())
            .backward();
        std::vector<at::Tensor> before;
        for (const auto& p : root.parameters()) before.push_back(p.grad().clone());
        expect_error_containing<InvalidArgument>(
            [&] { clip_grad_norm_(root.parameters(), 1e-3, pg); },
            "sharded over 2 ranks and replicated over 2 (hybrid sharding), but the group given "
            "has 4 ranks");
        const auto params = root.parameters();
        for (size_t i = 0; i < params.size(); ++i) {
          EXPECT_TRUE(at::equal(params[i].grad(), before[i])) << "unchanged " << i;
        }
        const double over_mesh = total_grad_norm(params, mesh);
        EXPECT_NEAR(over_mesh, total_grad_norm(root), 1e-12 * over_mesh);
        // The same while the parameters hold their gathered full tensors (their storage tells
        // their groups too).
        root.unshard();
        for (auto& layer : model->layers) layer.unshard();
        expect_error_containing<InvalidArgument>(
            [&] { clip_grad_norm_(root.parameters(), 1e-3, pg); },
            "sharded over 2 ranks and replicated over 2 (hybrid sharding)");
        root.reshard();
        for (auto& layer : model->layers) layer.reshard();
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
