// Activation checkpointing composed with fully_shard (FullyShardOptions::
// activation_checkpointing): the same losses and parameters as without it (fp32, bit for bit)
// at worlds 1-4 and with nested checkpointed units; the same collectives; dropout draws the
// same masks in the recompute; and the errors for bad use.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

class CheckpointedBlocks : public ::testing::TestWithParam<int> {};

TEST_P(CheckpointedBlocks, IdenticalToWithoutAndToOneProcess) {
  TrainSpec plain;
  plain.steps = 6;
  TrainSpec checkpointed = plain;
  checkpointed.checkpoint_blocks = true;
  auto want = train_reference(plain, /*slices=*/GetParam());
  run_local_ranks(
      GetParam(),
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(checkpointed, pg);
        auto without = train_sharded(plain, pg);
        if (pg->rank() != 0) return;
        // The recompute runs the same kernels on the same values: identical.
        EXPECT_EQ(max_rel_loss_error(got, without), 0.0);
        EXPECT_EQ(max_rel_param_error(got, without), 0.0);
        expect_parity("checkpointed", pg->size(), got, want, kFp32Tolerance);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Worlds, CheckpointedBlocks, ::testing::Values(1, 2, 3, 4));

// The root checkpointed as well: its recompute runs the blocks, which checkpoint again inside
// it; with accumulation and mixed precision on top.
TEST(CheckpointedUnits, NestedAndComposedWithAccumulationAndMixedPrecision) {
  for (bool mixed : {false, true}) {
    TrainSpec plain;
    plain.steps = 4;
    plain.micro_batches = 2;
    if (mixed) {
      plain.mp.param_dtype = at::kBFloat16;
      plain.mp.reduce_dtype = at::kFloat;
    }
    TrainSpec nested = plain;
    nested.checkpoint_blocks = true;
    nested.checkpoint_root = true;
    run_local_ranks(
        3,
        [&](const ProcessGroupPtr& pg) {
          auto got = train_sharded(nested, pg);
          auto without = train_sharded(plain, pg);
          EXPECT_EQ(max_rel_loss_error(got, without), 0.0) << "mixed " << mixed;
          EXPECT_EQ(max_rel_param_error(got, without), 0.0) << "mixed " << mixed;
        },
        test_options());
  }
}

// Checkpointing adds no collective: per step N+1 gathers in forward, N in backward (the
// blocks'; the recompute uses that gather; the root keeps its parameters), N+1
// reduce-scatters; nothing stays gathered.
TEST(CheckpointedUnits, SameCollectivesAndNothingLeftGathered) {
  TrainSpec spec;
  spec.checkpoint_blocks = true;
  auto pg = make_fake_group(/*rank=*/3, /*world_size=*/4);
  auto model = build_model(spec);
  auto root = shard_model(model, pg, spec);
  const int64_t n = static_cast<int64_t>(model->layers.size());
  for (int step = 0; step < 2; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    pg->reset_stats();
    auto loss =
        loss_of(root(tokens.narrow(0, 0, 3)), targets.narrow(0, 0, 3), spec.model.output_size());
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), n + 1);
    loss.backward();
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), (n + 1) + n);
    EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), n + 1);
    EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
  }
}

// A unit whose forward draws random numbers (dropout) and takes a non-tensor argument.
class NoisyImpl : public torch::nn::Module {
 public:
  NoisyImpl() { lin = register_module("lin", torch::nn::Linear(16, 16)); }
  torch::Tensor forward(const torch::Tensor& x, double p) {
    ++calls;
    return torch::dropout(torch::tanh(lin(x)), p, /*train=*/true);
  }
  torch::nn::Linear lin{nullptr};
  int calls = 0;
};
TORCH_MODULE(Noisy);

class NoisyNetImpl : public torch::nn::Module {
 public:
  NoisyNetImpl() {
    noisy = register_module("noisy", Noisy());
    head = register_module("head", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(noisy(x, 0.5)); }
  Unit<Noisy> noisy{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(NoisyNet);

struct NoisyStep {
  std::vector<at::Tensor> grads;  // after one backward
  at::Tensor next_draw;           // the generator's next numbers after it
  int forward_calls;
};

NoisyStep noisy_step(bool checkpoint) {
  torch::manual_seed(11);
  NoisyNet net;
  auto pg = make_local_groups(1).front();
  FullyShardOptions options;
  options.activation_checkpointing = checkpoint;
  fully_shard(net->noisy, pg, options);
  auto root = fully_shard(net, pg);
  torch::manual_seed(5);
  auto x = torch::randn({32, 16});
  root(x).pow(2).sum().backward();
  std::vector<at::Tensor> grads;
  for (const auto& p : net->parameters()) grads.push_back(p.grad().clone());
  return {grads, torch::rand({4}), net->noisy->calls};
}

TEST(CheckpointedUnits, DropoutDrawsTheSameMaskInTheRecompute) {
  auto want = noisy_step(false);
  auto got = noisy_step(true);
  EXPECT_EQ(want.forward_calls, 1);
  EXPECT_EQ(got.forward_calls, 2) << "the forward and its recompute";
  ASSERT_EQ(got.grads.size(), want.grads.size());
  for (size_t i = 0; i < got.grads.size(); ++i) {
    EXPECT_TRUE(at::equal(got.grads[i], want.grads[i])) << i;
  }
  // The recompute put the generator back where the step left it.
  EXPECT_TRUE(at::equal(got.next_draw, want.next_draw));
}

// A model that calls its checkpointed unit's module directly (bypass) instead of the Unit.
class BypassImpl : public torch::nn::Module {
 public:
  BypassImpl() {
    inner = register_module("inner", torch::nn::Linear(8, 8));
    head = register_module("head", torch::nn::Linear(8, 2));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head(inner->forward(x)); }
  Unit<torch::nn::Linear> inner{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Bypass);

TEST(CheckpointedUnits, ModuleCalledWithoutItsUnitIsAnError) {
  Bypass net;
  auto pg = make_local_groups(1).front();
  FullyShardOptions options;
  options.activation_checkpointing = true;
  fully_shard(net->inner, pg, options);
  auto root = fully_shard(net, pg);
  auto weight_before = net->inner->weight.detach().clone();
  expect_error_containing<InvalidArgument>(
      [&] {
        root(torch::randn({3, 8}));
      },
      "unit 'inner' (torch::nn::LinearImpl)");
  expect_error_containing<InvalidArgument>(
      [&] {
        root(torch::randn({3, 8}));
      },
      "call the unit, unit(x)");
  EXPECT_TRUE(at::equal(net->inner->weight, weight_before));
}

class PairOutImpl : public torch::nn::Module {
 public:
  PairOutImpl() { lin = register_module("lin", torch::nn::Linear(4, 4)); }
  std::pair<torch::Tensor, int64_t> forward(const torch::Tensor& x) { return {lin(x), 1}; }
  torch::nn::Linear lin{nullptr};
};
TORCH_MODULE(PairOut);

TEST(CheckpointedUnits, ForwardReturningNonTensorsIsRejectedBeforeGathering) {
  PairOut module;
  auto pg = make_fake_group(0, 2);
  FullyShardOptions options;
  options.activation_checkpointing = true;
  auto unit = fully_shard(module, pg, options);
  pg->reset_stats();
  expect_error_containing<InvalidArgument>([&] { unit(torch::randn({2, 4})); }, "std::pair");
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 0);
  // Without grad there is nothing to checkpoint: the forward runs.
  torch::NoGradGuard no_grad;
  EXPECT_EQ(unit(torch::randn({2, 4})).second, 1);
}

}  // namespace
}  // namespace fsdp::testing
