// FullyShardOptions::shard_placement_fn (FSDP2's Shard(d)): parameters sharded on dim 1 train
// bit for bit as on dim 0 (the same full weights compute, each gradient element is reduced the
// same way), hold [rows, cols / world] chunks, and go through state dicts and checkpoints to
// any world size and placement.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "support/train_harness.h"

namespace fsdp::testing {
namespace shard_placement_test {

// Dim 1 for every matrix whose columns divide by the world, else the default.
FullyShardOptions dim1_options(int world, const TrainSpec& spec) {
  FullyShardOptions o;
  o.mp_policy = spec.mp;
  o.offload_policy = spec.offload;
  o.shard_placement_fn = [world](const std::string&,
                                 const at::Tensor& p) -> std::optional<int64_t> {
    if (p.dim() == 2 && p.size(1) % world == 0) return 1;
    return std::nullopt;
  };
  return o;
}

struct Model {
  TinyLM model{nullptr};
  Unit<TinyLM> root;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Model make(const TrainSpec& spec, const ProcessGroupPtr& pg, bool dim1, int post_forward = 0) {
  Model m;
  m.model = build_model(spec);
  FullyShardOptions o = dim1 ? dim1_options(pg->size(), spec) : FullyShardOptions{};
  if (!dim1) {
    o.mp_policy = spec.mp;
    o.offload_policy = spec.offload;
  }
  FullyShardOptions blocks = o;
  blocks.reshard_after_forward_ranks = post_forward;
  for (auto& layer : m.model->layers) fully_shard(layer, pg, blocks);
  m.root = fully_shard(m.model, pg, o);
  m.opt = std::make_unique<torch::optim::AdamW>(m.root.parameters(),
                                                torch::optim::AdamWOptions(spec.lr));
  return m;
}

std::vector<double> train(Model& m, const TrainSpec& spec, const ProcessGroupPtr& pg, int from,
                          int to) {
  std::vector<double> losses;
  const int64_t local = spec.batch / pg->size();
  for (int step = from; step < to; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    m.opt->zero_grad();
    auto loss = loss_of(m.root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                        spec.model.output_size());
    loss.backward();
    m.opt->step();
    auto global = loss.detach().reshape({1}).clone();
    pg->all_reduce(global, ReduceOp::kAvg)->wait();
    losses.push_back(global.item<double>());
  }
  return losses;
}

struct Case {
  int world;
  bool bf16;
  bool offload;
  int post_forward;  // reshard_after_forward_ranks of the blocks
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "world " << c.world << (c.bf16 ? ", bf16" : "") << (c.offload ? ", offload" : "")
      << (c.post_forward ? ", post-forward ranks " + std::to_string(c.post_forward) : "");
}

class ShardPlacement : public ::testing::TestWithParam<Case> {};

TEST_P(ShardPlacement, Dim1TrainsBitForBitAsDim0) {
  const Case c = GetParam();
  TrainSpec spec;
  spec.steps = 3;
  if (c.bf16) {
    spec.mp.param_dtype = at::kBFloat16;
    spec.mp.reduce_dtype = at::kFloat;
  }
  if (c.offload) spec.offload = CPUOffloadPolicy{};
  run_local_ranks(
      c.world,
      [&](const ProcessGroupPtr& pg) {
        auto rows = make(spec, pg, false, c.post_forward);
        auto cols = make(spec, pg, true, c.post_forward);
        int chunked = 0;
        for (const auto& p : cols.root.parameters()) {
          auto s = shard_of(p);
          ASSERT_TRUE(s.has_value());
          if (s->shard_dim != 1) continue;
          ++chunked;
          EXPECT_EQ(p.size(0), s->global_shape[0]);
          EXPECT_EQ(p.size(1), s->global_shape[1] / c.world);
          EXPECT_TRUE(p.is_contiguous());
        }
        EXPECT_GT(chunked, 3);
        const auto want = train(rows, spec, pg, 0, spec.steps);
        const auto got = train(cols, spec, pg, 0, spec.steps);
        EXPECT_EQ(got, want);
        const auto a = get_full_model_state_dict(*cols.model, pg);
        const auto b = get_full_model_state_dict(*rows.model, pg);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
        }
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardPlacement,
                         ::testing::Values(Case{1, true, false, 0}, Case{2, false, false, 0},
                                           Case{4, true, false, 0}, Case{4, false, false, 2},
                                           Case{2, false, true, 0}));

// Saved with dim 1 at world 2, resumed with dim 0 at world 4 (and back): the uninterrupted
// run's losses within the reshard's rounding; sharded state dicts move between the placements
// exactly.
TEST(ShardPlacementCheckpoint, ResumesAcrossPlacementsAndWorlds) {
  TrainSpec spec;
  const std::string dir = "/tmp/fsdp_placement_ckpt_" + std::to_string(::getpid());
  std::system(("rm -rf '" + dir + "'").c_str());
  for (const bool save_dim1 : {true, false}) {
    std::vector<double> uninterrupted, resumed;
    std::string path;
    const int save_world = save_dim1 ? 2 : 4, load_world = save_dim1 ? 4 : 2;
    run_local_ranks(
        save_world,
        [&](const ProcessGroupPtr& pg) {
          auto m = make(spec, pg, save_dim1);
          train(m, spec, pg, 0, 2);
          auto p = save_checkpoint(dir, save_dim1 ? 2 : 3, *m.model, m.opt.get(), pg);
          auto rest = train(m, spec, pg, 2, 4);
          if (pg->rank() == 0) path = p, uninterrupted = rest;
        },
        test_options());
    run_local_ranks(
        load_world,
        [&](const ProcessGroupPtr& pg) {
          auto m = make(spec, pg, !save_dim1);
          load_checkpoint(path, *m.model, m.opt.get(), pg);
          auto rest = train(m, spec, pg, 2, 4);
          if (pg->rank() == 0) resumed = rest;
        },
        test_options());
    ASSERT_EQ(resumed.size(), uninterrupted.size());
    for (size_t i = 0; i < resumed.size(); ++i) {
      EXPECT_NEAR(resumed[i], uninterrupted[i], 1e-5 * std::abs(uninterrupted[i]))
          << (save_dim1 ? "dim 1 at world 2 -> dim 0 at world 4" : "dim 0 at 4 -> dim 1 at 2")
          << ", step " << i;
    }
  }
  std::system(("rm -rf '" + dir + "'").c_str());

  // In memory: a dim-0 model's sharded state dict into a dim-1 model, and the full state dict.
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto rows = make(spec, pg, false);
        train(rows, spec, pg, 0, 1);
        auto cols = make(spec, pg, true);
        set_model_state_dict(*cols.model, get_model_state_dict(*rows.model), pg);
        auto a = get_full_model_state_dict(*cols.model, pg);
        auto b = get_full_model_state_dict(*rows.model, pg);
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
        }
        auto fresh = make(spec, pg, true);
        set_model_state_dict(*fresh.model, b, pg);
        auto c = get_full_model_state_dict(*fresh.model, pg);
        for (size_t i = 0; i < c.size(); ++i) {
          EXPECT_TRUE(at::equal(c[i].second, b[i].second)) << c[i].first;
        }
        // Optimizer state, dim 0 to dim 1: the next step is the same.
        set_optimizer_state_dict(*cols.model, *cols.opt,
                                 get_optimizer_state_dict(*rows.model, *rows.opt), pg);
        const auto want = train(rows, spec, pg, 1, 2);
        const auto got = train(cols, spec, pg, 1, 2);
        EXPECT_EQ(got, want);
      },
      test_options());
}

TEST(ShardPlacementErrors, RefusesDimsThatDoNotDivideOrExist) {
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        auto model = build_model(spec);
        try {
          FullyShardOptions bad;
          bad.shard_placement_fn = [](const std::string&, const at::Tensor& p) {
            return std::optional<int64_t>(p.dim());
          };
          fully_shard(model->layers[0], pg, bad);
          ADD_FAILURE() << "a dim past the tensor's was accepted";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("dims"), std::string::npos) << e.what();
        }
        TrainSpec odd;
        odd.model.dim = 62;  // not divisible by 3
        odd.model.heads = 2;
        auto other = build_model(odd);
        try {
          FullyShardOptions cols;
          cols.shard_placement_fn = [](const std::string&, const at::Tensor& p) {
            return p.dim() == 2 ? std::optional<int64_t>(-1) : std::nullopt;
          };
          fully_shard(other->layers[0], pg, cols);
          ADD_FAILURE() << "an uneven dim 1 was accepted";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("must shard evenly"), std::string::npos) << e.what();
        }
        EXPECT_FALSE(FSDPModule(other->layers[0]).is_sharded());
      },
      test_options());
}

}  // namespace shard_placement_test
}  // namespace fsdp::testing
