// fully_shard of several modules as one unit (FSDP2's fully_shard([m1, m2])): one all-gather
// before the first member's forward, freed after the last's, one reduce-scatter for them all;
// training equals the same modules as separate units bit for bit (each parameter is sharded and
// reduced element by element the same way) and the unsharded model within rounding.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "support/train_harness.h"

namespace fsdp::testing {
namespace module_group_test {

struct HeadNetImpl : torch::nn::Module {
  HeadNetImpl() {
    emb = register_module("emb", torch::nn::Embedding(11, 8));
    a = register_module("a", torch::nn::Linear(8, 12));
    b = register_module("b", torch::nn::Linear(12, 8));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})));
    head = register_module("head", torch::nn::Linear(8, 11));
  }
  at::Tensor forward(const at::Tensor& tokens) {
    auto x = emb(tokens);
    x = x + b(a(x).relu());
    x = norm(x);
    if (skip_head) return x.sum(-1);  // a forward in which a member does not run
    auto y = head(x);
    return head_twice ? y + head(x * 0.5) : y;
  }
  bool skip_head = false, head_twice = false;
  torch::nn::Embedding emb{nullptr};
  Unit<torch::nn::Linear> a, b, head;
  Unit<torch::nn::LayerNorm> norm;
};
TORCH_MODULE(HeadNet);

enum class Units { kNone, kSeparate, kGrouped };

struct Inputs {
  std::vector<at::Tensor> init;  // the parameters every run starts from
  at::Tensor tokens, targets;    // [steps, batch, seq]
  int steps = 4;
  int64_t batch = 4, seq = 3;
};

Inputs make_inputs() {
  Inputs s;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  HeadNet net;
  for (const auto& p : net->parameters()) s.init.push_back(at::randn(p.sizes(), gen) * 0.3);
  s.tokens = at::randint(11, {s.steps, s.batch, s.seq}, gen);
  s.targets = at::randint(11, {s.steps, s.batch, s.seq}, gen);
  return s;
}

struct Model {
  HeadNet net;
  Unit<HeadNet> root;
  std::vector<FSDPModule> group;
};

Model make(const Inputs& s, Units units, const ProcessGroupPtr& pg, FullyShardOptions opts = {}) {
  Model r;
  {
    at::NoGradGuard no_grad;
    auto params = r.net->parameters();
    for (size_t i = 0; i < params.size(); ++i) params[i].copy_(s.init[i]);
  }
  r.root = Unit<HeadNet>(r.net);
  if (units == Units::kNone) return r;
  fully_shard(r.net->a, pg, opts);
  fully_shard(r.net->b, pg, opts);
  if (units == Units::kGrouped) {
    r.group = fully_shard({r.net->norm, r.net->head}, pg, opts);
  } else {
    fully_shard(r.net->norm, pg, opts);
    fully_shard(r.net->head, pg, opts);
  }
  r.root = fully_shard(r.net, pg);
  return r;
}

std::vector<double> train(Model& r, const Inputs& s, int rank, int world) {
  torch::optim::SGD opt(r.root.parameters(), torch::optim::SGDOptions(0.5));
  std::vector<double> losses;
  const int64_t local = s.batch / world;
  for (int step = 0; step < s.steps; ++step) {
    opt.zero_grad();
    auto tokens = s.tokens[step].narrow(0, rank * local, local);
    auto targets = s.targets[step].narrow(0, rank * local, local);
    auto logits = r.root(tokens);
    auto loss = at::cross_entropy_loss(logits.reshape({-1, 11}), targets.reshape(-1));
    loss.backward();
    opt.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

class ModuleGroup : public ::testing::TestWithParam<int> {};

TEST_P(ModuleGroup, TrainsAsSeparateUnitsWithOneGatherForTheGroup) {
  const int world = GetParam();
  const Inputs s = make_inputs();
  std::vector<double> plain;
  {
    Model r = make(s, Units::kNone, nullptr);
    plain = train(r, s, 0, 1);
  }
  std::vector<std::vector<double>> separate(world), grouped(world), checkpointed(world);
  std::vector<int64_t> gathers_separate(world), gathers_grouped(world);
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        const int rank = pg->rank();
        auto count = [&] { return pg->stats().count(CollectiveKind::kAllGather); };
        Model sep = make(s, Units::kSeparate, pg);
        auto before = count();
        separate[rank] = train(sep, s, rank, world);
        gathers_separate[rank] = count() - before;

        Model grp = make(s, Units::kGrouped, pg);
        before = count();
        grouped[rank] = train(grp, s, rank, world);
        gathers_grouped[rank] = count() - before;
        // Every rank's full parameters equal the separate units' run.
        auto a = get_full_model_state_dict(*grp.net, pg);
        auto b = get_full_model_state_dict(*sep.net, pg);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
        }
        // Both members are the same unit; after a forward without gradients both are freed.
        ASSERT_EQ(grp.group.size(), 2u);
        {
          at::NoGradGuard no_grad;
          grp.root(s.tokens[0]);
        }
        EXPECT_EQ(grp.group[0].sharded_state(), ShardedState::kSharded);
        EXPECT_EQ(grp.group[1].sharded_state(), ShardedState::kSharded);

        FullyShardOptions ac;
        ac.activation_checkpointing = true;
        Model ckpt = make(s, Units::kGrouped, pg, ac);
        checkpointed[rank] = train(ckpt, s, rank, world);
      },
      test_options());
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(grouped[r], separate[r]) << "rank " << r;
    EXPECT_EQ(checkpointed[r], separate[r]) << "rank " << r << " with activation checkpointing";
    // norm and head: one gather before forward and one before backward instead of two each
    // (one rank in its own dtype gathers nothing).
    EXPECT_EQ(gathers_separate[r] - gathers_grouped[r], world > 1 ? 2 * s.steps : 0)
        << "rank " << r;
  }
  // The average of the ranks' losses is the full batch's (equal shares of the batch).
  for (int step = 0; step < s.steps; ++step) {
    double mean = 0;
    for (int r = 0; r < world; ++r) mean += grouped[r][step] / world;
    EXPECT_NEAR(mean, plain[step], 1e-5 * std::abs(plain[step])) << "step " << step;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ModuleGroup, ::testing::Values(1, 2, 4));

// A forward in which a member does not run (an evaluation that stops at the norm) completes the
// unit at the end of the root's forward: nothing stays gathered, and training after it is the
// separate units' training. A member called twice in a forward counts once.
TEST(ModuleGroupMembers, SkippedOrRepeatedMembers) {
  const Inputs s = make_inputs();
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        for (bool twice : {false, true}) {
          Model sep = make(s, Units::kSeparate, pg);
          Model grp = make(s, Units::kGrouped, pg);
          for (Model* m : {&sep, &grp}) {
            at::NoGradGuard no_grad;
            m->net->skip_head = true;
            m->root(s.tokens[0]);
            m->net->skip_head = false;
            m->net->head_twice = twice;
          }
          EXPECT_EQ(grp.group[0].sharded_state(), ShardedState::kSharded);
          EXPECT_EQ(grp.group[1].sharded_state(), ShardedState::kSharded);
          // With gradients: the head's skipped member leaves the unit to the root's end, and
          // backward gathers it again for the norm.
          {
            grp.net->skip_head = true;
            auto out = grp.root(s.tokens[0]);
            EXPECT_EQ(grp.group[0].sharded_state(), ShardedState::kSharded);
            out.sum().backward();
            grp.net->skip_head = false;
            sep.net->skip_head = true;
            sep.root(s.tokens[0]).sum().backward();
            sep.net->skip_head = false;
          }
          const auto want = train(sep, s, pg->rank(), 2);
          const auto got = train(grp, s, pg->rank(), 2);
          EXPECT_EQ(got, want) << (twice ? "head twice" : "");
        }
      },
      test_options());
}

TEST(ModuleGroupErrors, RefusesListsThatAreNotDisjointUnsharded) {
  run_local_ranks(
      1,
      [&](const ProcessGroupPtr& pg) {
        HeadNet net;
        EXPECT_THROW(fully_shard(std::vector<FSDPModule>{}, pg), InvalidArgument);
        try {
          fully_shard({net->head, net->head}, pg);
          ADD_FAILURE() << "a module listed twice was accepted";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("is the same as"), std::string::npos) << e.what();
        }
        try {
          fully_shard({FSDPModule(net.ptr()), net->head}, pg);
          ADD_FAILURE() << "a module inside another was accepted";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("is inside"), std::string::npos) << e.what();
        }
        fully_shard(net->head, pg);
        EXPECT_THROW(fully_shard({net->norm, net->head}, pg), InvalidArgument);
        EXPECT_FALSE(FSDPModule(net->norm).is_sharded()) << "a refused list shards nothing";
      },
      test_options());
}

}  // namespace module_group_test
}  // namespace fsdp::testing
