// fully_shard beyond parity: collective counts per step, nested units, unused outputs, buffers,
// manual unshard/reshard, memory accounting, and the errors for bad use.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

// Counts per step with N = 2 blocks plus the root (FSDP2's test_fully_shard_comm numbers):
// forward N+1 all-gathers; backward N+1 (reshard) or 0 (keep); N+1 reduce-scatters.
class CollectiveCounts : public ::testing::TestWithParam<bool> {};

TEST_P(CollectiveCounts, PerStep) {
  const bool reshard = GetParam();
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        auto model = build_model(spec);
        FullyShardOptions options;
        options.reshard_after_forward = reshard;
        auto root = shard_model(model, pg, options);
        const int64_t n = static_cast<int64_t>(model->layers.size());
        for (int step = 0; step < 3; ++step) {  // later steps prefetch: counts must not change
          auto [tokens, targets] = global_batch(spec, step);
          pg->reset_stats();
          auto loss = loss_of(root(rank_slice(tokens, pg, 6)), rank_slice(targets, pg, 6),
                              spec.model.output_size());
          EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), n + 1) << "forward";
          EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), 0);
          pg->reset_stats();
          loss.backward();
          EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), reshard ? n + 1 : 0)
              << "backward";
          EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), n + 1);
        }
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Reshard, CollectiveCounts, ::testing::Bool());

// A small model with a unit inside a unit, a unit whose output the loss ignores, and a buffer.
class InnerImpl : public torch::nn::Module {
 public:
  InnerImpl() {
    lin = register_module("lin", torch::nn::Linear(8, 8));
    inner = register_module("inner", torch::nn::Linear(8, 8));
    register_buffer("scale", torch::full({8}, 0.5));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return torch::tanh(inner(lin(x))) * named_buffers()["scale"];
  }
  torch::nn::Linear lin{nullptr};
  Unit<torch::nn::Linear> inner{nullptr};
};
TORCH_MODULE(Inner);

class NetImpl : public torch::nn::Module {
 public:
  NetImpl() {
    block = register_module("block", Inner());
    unused = register_module("unused", torch::nn::Linear(8, 5));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    auto h = block(x);
    auto ignored = unused(h);  // computed, never reaches the loss
    (void)ignored;
    return head(h);
  }
  Unit<Inner> block{nullptr};
  Unit<torch::nn::Linear> unused{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

Net build_net() {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  torch::manual_seed(7);
  return Net();
}

std::pair<at::Tensor, at::Tensor> net_batch(int step) {
  auto gen = at::detail::createCPUGenerator(100 + step);
  return {at::randn({6, 8}, gen), at::randint(3, {6}, gen, at::kLong)};
}

TEST(NestedUnusedBuffers, MatchSingleProcess) {
  // Reference: one process, the two halves' gradients averaged, AdamW.
  auto ref = build_net();
  torch::optim::AdamW ref_opt(ref->parameters(), torch::optim::AdamWOptions(1e-2));
  for (int step = 0; step < 5; ++step) {
    auto [x, y] = net_batch(step);
    ref_opt.zero_grad();
    for (int half = 0; half < 2; ++half) {
      auto loss = loss_of(ref(x.narrow(0, half * 3, 3)), y.narrow(0, half * 3, 3), 3) * 0.5;
      loss.backward();
    }
    ref_opt.step();
  }
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto net = build_net();
        fully_shard(net->block->inner.module(), pg);  // a unit inside a unit
        fully_shard(net->block.module(), pg);
        fully_shard(net->unused.module(), pg);
        auto root = fully_shard(net, pg);
        torch::optim::AdamW opt(root->parameters(), torch::optim::AdamWOptions(1e-2));
        for (int step = 0; step < 5; ++step) {
          auto [x, y] = net_batch(step);
          opt.zero_grad();
          loss_of(root(rank_slice(x, pg, 3)), rank_slice(y, pg, 3), 3).backward();
          // The unused unit got no gradient: nothing was reduced into it.
          for (const auto& p : net->unused->parameters()) EXPECT_FALSE(p.grad().defined());
          opt.step();
        }
        auto ref_params = ref->named_parameters();
        for (const auto& item : net->named_parameters()) {
          auto full = gather_full(pg, item.value(), ref_params[item.key()].size(0));
          EXPECT_TRUE(at::allclose(full, ref_params[item.key()], 1e-5, 1e-6)) << item.key();
        }
        EXPECT_TRUE(at::equal(net->block->named_buffers()["scale"], at::full({8}, 0.5)));
      },
      test_options());
}

// Three SGD steps (SGD, so rounding is not amplified) of a sharded model on this rank's 6
// sequences of each global batch; `backward` runs forward and backward for one step. Returns
// this rank's parameter shards.
using StepBackward = std::function<void(Unit<TinyLM>& root, const at::Tensor& tokens,
                                        const at::Tensor& targets, int64_t classes)>;
std::vector<at::Tensor> train_sgd(const TrainSpec& spec, const ProcessGroupPtr& pg,
                                  const StepBackward& backward) {
  auto model = build_model(spec);
  auto root = shard_model(model, pg);
  torch::optim::SGD opt(root->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 3; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    opt.zero_grad();
    backward(root, rank_slice(tokens, pg, 6), rank_slice(targets, pg, 6), spec.model.output_size());
    opt.step();
  }
  std::vector<at::Tensor> shards;
  for (const auto& p : model->parameters()) shards.push_back(p.detach().clone());
  return shards;
}

void expect_same_parameters(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(at::allclose(a[i], b[i], 1e-5, 1e-6)) << "parameter " << i;
  }
}

// Half of this rank's sequences (h = 0 or 1), its loss halved.
at::Tensor half_loss(Unit<TinyLM>& root, const at::Tensor& tokens, const at::Tensor& targets,
                     int64_t classes, int h) {
  return loss_of(root(tokens.narrow(0, 3 * h, 3)), targets.narrow(0, 3 * h, 3), classes) / 2;
}

// Gradient accumulation: two micro-batches per step without zero_grad between them add up in
// the sharded gradients, matching one pass over both.
TEST(GradientAccumulation, MicroBatchesAddUpInShardedGrads) {
  run_local_ranks(
      2,
      [](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        auto one = train_sgd(spec, pg, [](auto& root, auto& x, auto& y, int64_t classes) {
          loss_of(root(x), y, classes).backward();
        });
        auto two = train_sgd(spec, pg, [](auto& root, auto& x, auto& y, int64_t classes) {
          half_loss(root, x, y, classes, 0).backward();
          half_loss(root, x, y, classes, 1).backward();
        });
        expect_same_parameters(two, one);
      },
      test_options());
}

// Two forwards feeding one backward (a frozen weight forces the input-side post-backward):
// the same gradients as two separate backward passes.
TEST(GradientAccumulation, TwoForwardsOneBackward) {
  run_local_ranks(
      2,
      [](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        spec.edit_model = [](TinyLM& m) { m->layers[0]->norm1->weight.set_requires_grad(false); };
        auto separate = train_sgd(spec, pg, [](auto& root, auto& x, auto& y, int64_t classes) {
          half_loss(root, x, y, classes, 0).backward();
          half_loss(root, x, y, classes, 1).backward();
        });
        auto joint = train_sgd(spec, pg, [](auto& root, auto& x, auto& y, int64_t classes) {
          auto a = half_loss(root, x, y, classes, 0);
          auto b = half_loss(root, x, y, classes, 1);
          (a + b).backward();
        });
        expect_same_parameters(joint, separate);
      },
      test_options());
}

// Evaluation under NoGradGuard frees everything after forward (the root too) and leaves
// training afterwards unaffected.
TEST(Evaluation, NoGradForwardFreesAllAndTrainingGoesOn) {
  run_local_ranks(
      2,
      [](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        spec.steps = 3;
        auto model = build_model(spec);
        auto root = shard_model(model, pg);
        auto [tokens, targets] = global_batch(spec, 0);
        at::Tensor eval_logits;
        {
          torch::NoGradGuard no_grad;
          eval_logits = root(rank_slice(tokens, pg, 6));
        }
        EXPECT_FALSE(eval_logits.requires_grad());
        EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
        torch::optim::AdamW opt(root->parameters(), torch::optim::AdamWOptions(1e-2));
        opt.zero_grad();
        auto logits = root(rank_slice(tokens, pg, 6));
        EXPECT_TRUE(at::allclose(logits.detach(), eval_logits, 1e-6, 1e-6));
        loss_of(logits, rank_slice(targets, pg, 6), spec.model.output_size()).backward();
        opt.step();
        EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
      },
      test_options());
}

TEST(ManualUnshard, GathersAndFreesOnRequest) {
  run_local_ranks(
      2,
      [](const ProcessGroupPtr& pg) {
        auto net = build_net();
        auto full_head = net->head->weight.detach().clone();
        auto root = fully_shard(net, pg);
        EXPECT_EQ(net->head->weight.size(0), pg->rank() == 0 ? 2 : 1);
        root.unshard();
        EXPECT_TRUE(at::equal(net->head->weight, full_head));
        EXPECT_GT(root.memory_stats().tree.full_param_bytes, 0);
        root.reshard();
        EXPECT_EQ(net->head->weight.size(0), pg->rank() == 0 ? 2 : 1);
        EXPECT_EQ(root.memory_stats().tree.full_param_bytes, 0);
      },
      test_options());
}

TEST(MemoryStats, ShardsAndPeakFullParameters) {
  run_local_ranks(
      2,
      [](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        auto model = build_model(spec);
        int64_t block_bytes = 0, total_bytes = 0;
        for (const auto& p : model->layers[0]->parameters()) block_bytes += p.nbytes();
        for (const auto& p : model->parameters()) total_bytes += p.nbytes();
        const int64_t root_bytes = total_bytes - 2 * block_bytes;
        auto root = shard_model(model, pg);
        torch::optim::AdamW opt(root->parameters(), torch::optim::AdamWOptions(1e-3));
        auto [tokens, targets] = global_batch(spec, 0);
        loss_of(root(rank_slice(tokens, pg, 6)), rank_slice(targets, pg, 6),
                spec.model.output_size())
            .backward();
        opt.step();
        auto m = root.memory_stats();
        // About half of every parameter (ceil rows on rank 0), and the same for gradients.
        EXPECT_GE(m.sharded_param_bytes, total_bytes / 2 - 2 * 4 * 60);
        EXPECT_LE(m.sharded_param_bytes, total_bytes / 2 + 2 * 4 * 60);
        EXPECT_EQ(m.sharded_grad_bytes, m.sharded_param_bytes);
        EXPECT_EQ(m.tree.full_param_bytes, 0) << "everything is freed after backward";
        // The root stays gathered; at most two blocks are gathered with it.
        EXPECT_GE(m.tree.peak_full_param_bytes, root_bytes + block_bytes);
        EXPECT_LE(m.tree.peak_full_param_bytes, root_bytes + 2 * block_bytes);
        EXPECT_GT(m.tree.peak_comm_buffer_bytes, 0);
        EXPECT_EQ(m.tree.comm_buffer_bytes, 0);
      },
      test_options());
}

TEST(FullyShardOnFakeGroup, PlaysRankOfEightForMemoryAndCounts) {
  TrainSpec spec;
  auto pg = make_fake_group(/*rank=*/7, /*world_size=*/8);
  auto model = build_model(spec);
  const int64_t expected = expected_shard_bytes(model, /*world=*/8, /*rank=*/7);
  auto root = shard_model(model, pg);
  auto [tokens, targets] = global_batch(spec, 0);
  pg->reset_stats();
  loss_of(root(tokens.narrow(0, 0, 2)), targets.narrow(0, 0, 2), spec.model.output_size())
      .backward();
  EXPECT_EQ(root.memory_stats().sharded_param_bytes, expected);
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 3 + 2);
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), 3);
}

// Bad use: each raises InvalidArgument naming the problem.
template <typename Fn>
void expect_invalid(Fn fn, const std::string& needle) {
  expect_error_containing<InvalidArgument>(fn, needle);
}

TEST(BadUse, ShardingTwice) {
  auto net = build_net();
  auto pg = make_fake_group(0, 2);
  fully_shard(net->head, pg);
  expect_invalid([&] { fully_shard(net->head, pg); }, "already sharded");
}

TEST(BadUse, ParentBeforeChild) {
  auto net = build_net();
  auto pg = make_fake_group(0, 2);
  fully_shard(net, pg);
  expect_invalid([&] { fully_shard(net->head, pg); }, "shard inner modules before");
}

TEST(BadUse, MixedDtypesScalarsAndDevices) {
  auto pg = make_fake_group(0, 2);
  auto mixed = torch::nn::Sequential(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4));
  mixed[1]->to(at::kDouble);
  expect_invalid([&] { fully_shard(mixed, pg); }, "mixes parameter dtypes");

  auto scalar = torch::nn::Linear(4, 4);
  scalar->register_parameter("temperature", torch::ones({}));
  expect_invalid([&] { fully_shard(scalar, pg); }, "is a scalar");

  auto cuda_pg = make_fake_group(0, 2, at::kCUDA);
  expect_invalid([&] { fully_shard(torch::nn::Linear(4, 4), cuda_pg); }, "works on cuda");
}

TEST(BadUse, WorldSizeMismatch) {
  auto net = build_net();
  fully_shard(net->block.module(), make_fake_group(0, 2));
  auto root = fully_shard(net, make_fake_group(0, 4));
  expect_invalid([&] { root(at::randn({2, 8})); }, "share a world size");
}

TEST(BadUse, InnerUnitBeforeRoot) {
  auto net = build_net();
  auto pg = make_fake_group(0, 2);
  fully_shard(net->block.module(), pg);
  fully_shard(net, pg);
  expect_invalid([&] { net->block(at::randn({2, 8})); }, "before the root was set up");
}

}  // namespace
}  // namespace fsdp::testing
