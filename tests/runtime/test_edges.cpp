// The runtime's edges against a single process, at worlds 1-4 on thread ranks (the MPI binary
// runs the same programs): zero_grad at every place of the step, requires_grad changing after
// fully_shard, and steps that fail in forward or backward or skip the backward.
#include <gtest/gtest.h>

#include <map>

#include "runtime/edge_cases.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

// --- zero_grad
// ------------------------------------------------------------------------------------

struct ZeroGradCase {
  ZeroGradAt at;
  bool set_to_none;
  bool reshard_after_forward;
};

class ZeroGrad : public ::testing::TestWithParam<ZeroGradCase> {};

TEST_P(ZeroGrad, MeansWhatItMeansWithoutFsdp) {
  const auto c = GetParam();
  EdgeSpec spec;
  spec.options.reshard_after_forward = c.reshard_after_forward;
  const auto program = zero_grad_program(c.at, c.set_to_none);
  const auto want = reference_of(spec, program);
  for (int world : {1, 2, 3, 4}) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          expect_edge_parity(zero_grad_name(c.at), spec, flat_mesh(pg), program, want);
        },
        test_options());
  }
}

std::vector<ZeroGradCase> zero_grad_cases() {
  std::vector<ZeroGradCase> out;
  for (auto at : {ZeroGradAt::kBeforeForward, ZeroGradAt::kBetweenForwardAndBackward,
                  ZeroGradAt::kAfterStep, ZeroGradAt::kInPlaceBetween}) {
    for (bool none : {true, false}) {
      for (bool reshard : {true, false}) out.push_back({at, none, reshard});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Placements, ZeroGrad, ::testing::ValuesIn(zero_grad_cases()),
                         [](const auto& info) {
                           return std::string(zero_grad_name(info.param.at)) +
                                  (info.param.set_to_none ? "_to_none" : "_to_zero") +
                                  (info.param.reshard_after_forward ? "_reshard" : "_keep");
                         });

// --- requires_grad changing after fully_shard
// -----------------------------------------------------

struct FreezeCase {
  std::string name;
  std::vector<std::string> frozen;  // name prefixes
  int from, to;                     // frozen during steps [from, to)
  bool at_shard_time;               // frozen before fully_shard (from == 0)
  int micro_batches = 1;
  bool checkpoint = false;
  int replicas = 1;  // hybrid sharding at world 4
};

class Trainable : public ::testing::TestWithParam<FreezeCase> {};

TEST_P(Trainable, ReadAtEachStep) {
  const auto c = GetParam();
  EdgeSpec spec;
  spec.batch = 24;  // micro-batches split every rank's slice at worlds 1-4
  spec.options.activation_checkpointing = c.checkpoint;
  if (c.at_shard_time) {
    spec.edit = [c](EdgeNetImpl& net) { set_trainable(net, c.frozen, false); };
  }
  const auto program =
      freeze_program(c.frozen, c.at_shard_time ? -1 : c.from, c.to, c.micro_batches);
  const auto want = reference_of(spec, program);
  const std::vector<int> worlds =
      c.replicas > 1 ? std::vector<int>{4} : std::vector<int>{1, 2, 3, 4};
  for (int world : worlds) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          const auto mesh = c.replicas > 1 ? make_device_mesh(pg, c.replicas) : flat_mesh(pg);
          expect_edge_parity(c.name, spec, mesh, program, want);
        },
        test_options());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Freezing, Trainable,
    ::testing::Values(
        // Frozen at fully_shard time, unfrozen later: gets its gradient from then on.
        FreezeCase{"frozen_at_shard_then_unfrozen", {"in.", "blocks.1."}, 0, 3, true},
        // Only the biases train, all along.
        FreezeCase{
            "biases_only",
            {"in.weight", "blocks.0.fc1.weight", "blocks.0.fc2.weight", "blocks.1.fc1.weight",
             "blocks.1.fc2.weight", "blocks.2.fc1.weight", "blocks.2.fc2.weight", "head.weight"},
            0,
            1000,
            true},
        // Frozen after fully_shard, then unfrozen.
        FreezeCase{"frozen_after_shard", {"head.", "blocks.0."}, 2, 4, false},
        // A whole unit frozen at fully_shard time, unfrozen at step 3.
        FreezeCase{"whole_unit", {"blocks.2."}, 0, 3, true},
        FreezeCase{"with_checkpointing", {"blocks.1.fc2."}, 1, 4, false, 1, true},
        FreezeCase{"with_accumulation", {"blocks.0.", "in.bias"}, 1, 4, false, 2},
        FreezeCase{"with_hybrid_sharding", {"head.", "blocks.1."}, 2, 4, false, 1, false, 2}),
    [](const auto& info) { return info.param.name; });

// The reduce-scatter carries exactly the trainable parameters: its bytes are theirs, padded.
TEST(TrainableBytes, ReduceScatterCarriesOnlyTrainableParameters) {
  EdgeSpec spec;
  spec.steps = 1;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_edge_net(spec, nullptr);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        auto [x, y] = edge_batch(spec, 0);
        auto step = [&]() {
          pg->reset_stats();
          torch::nn::functional::cross_entropy(root(rank_slice(x, pg, 6)), rank_slice(y, pg, 6))
              .backward();
          return pg->stats().bytes_of(CollectiveKind::kReduceScatter);
        };
        // Every parameter's padded rows over 2 ranks, fp32, times the 2 ranks' contributions
        // (shapes from an unsharded copy).
        auto full = build_edge_net(spec, nullptr);
        std::map<std::string, std::vector<int64_t>> shapes;
        for (const auto& p : full->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
        auto bytes_of = [&](bool trainable_only) {
          int64_t b = 0;
          for (const auto& p : net->named_parameters()) {
            if (trainable_only && !p.value().requires_grad()) continue;
            const auto& shape = shapes.at(p.key());
            const int64_t row = shape.size() == 2 ? shape[1] : 1;
            b += 2 * ((shape[0] + 1) / 2) * row * 4;
          }
          return b;
        };
        const int64_t all = step();
        EXPECT_EQ(all, bytes_of(false));
        set_trainable(*net, {"blocks.0.", "head.weight"}, false);
        EXPECT_EQ(step(), bytes_of(true));
        EXPECT_LT(bytes_of(true), all);
        set_trainable(*net, {"blocks.0.", "head.weight"}, true);
        EXPECT_EQ(step(), all) << "unfrozen: the layout is the whole one again";
      },
      test_options());
}

// --- failures
// ----------------------------------------------------------------------------------------

class Failures : public ::testing::TestWithParam<Failure> {};

TEST_P(Failures, TreeIsCleanAndTrainingGoesOn) {
  const Failure f = GetParam();
  EdgeSpec spec;
  const int at = 2;
  auto ref_probe = std::make_shared<Probe>();
  auto ref_clean = std::make_shared<bool>(true);
  const auto want =
      reference_of(spec, failure_program(f, at, ref_probe, ref_clean, spec.blocks), ref_probe);
  for (int world : {1, 2, 3, 4}) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          auto probe = std::make_shared<Probe>();
          auto clean = std::make_shared<bool>(true);
          expect_edge_parity(failure_name(f), spec, flat_mesh(pg),
                             failure_program(f, at, probe, clean, spec.blocks), want, probe);
          EXPECT_TRUE(*clean) << failure_name(f) << ": the tree was not clean after the failure";
        },
        test_options());
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, Failures,
                         ::testing::Values(Failure::kInnerForward, Failure::kRootForward,
                                           Failure::kBackwardHook, Failure::kSkippedBackward),
                         [](const auto& info) { return std::string(failure_name(info.param)); });

// After a backward that threw, the gradient-sync switch is accepted again (the backward is
// over, though its end-of-backward callback never ran).
TEST(FailuresThen, SettingsAcceptedAfterAFailedBackward) {
  EdgeSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto probe = std::make_shared<Probe>();
        auto net = build_edge_net(spec, probe);
        auto root = shard_edge_net(net, flat_mesh(pg), spec);
        auto [x, y] = edge_batch(spec, 0);
        probe->throw_in_backward = 1;
        auto loss =
            torch::nn::functional::cross_entropy(root(rank_slice(x, pg, 6)), rank_slice(y, pg, 6));
        EXPECT_THROW(loss.backward(), std::exception);
        EXPECT_NO_THROW(root.set_requires_gradient_sync(false));
        EXPECT_NO_THROW(root.set_requires_gradient_sync(true));
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
