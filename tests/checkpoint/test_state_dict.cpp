// State dicts in memory (state_dict.h) over thread ranks: sharded dicts without communication,
// full dicts equal to the unsharded model, round trips that reshard between world sizes (and
// into an unsharded model), errors before any change; the optimizers whose state checkpoints
// hold (Adam, RMSprop, Adagrad besides AdamW and SGD) resume exactly, also across a reshard.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <mutex>

#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

using Full = std::map<std::string, at::Tensor>;

Full to_map(const FullStateDict& d) {
  Full out;
  for (const auto& [k, v] : d) out[k] = v;
  return out;
}

Full unsharded_params(const TrainSpec& spec) {
  auto model = build_model(spec);
  Full out;
  for (const auto& [name, t] : get_model_state_dict(*model)) out[name] = t.local.detach().clone();
  return out;
}

void expect_equal(const Full& got, const Full& want, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << label << ": " << name;
    EXPECT_TRUE(at::equal(it->second, t)) << label << ": " << name;
  }
}

// A sharded model trained `steps` steps with AdamW.
struct Run {
  TinyLM model{nullptr};
  std::unique_ptr<Unit<TinyLM>> root;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

using MakeOptimizer =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

void train_steps(Run& r, const TrainSpec& spec, const ProcessGroupPtr& pg, int first, int last) {
  const int64_t local = spec.batch / pg->size();
  for (int step = first; step < last; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    r.opt->zero_grad();
    loss_of((*r.root)(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
            spec.model.output_size())
        .backward();
    r.opt->step();
  }
}

Run make_run(const TrainSpec& spec, const ProcessGroupPtr& pg, const MakeOptimizer& make) {
  Run r;
  r.model = build_model(spec);
  r.root = std::make_unique<Unit<TinyLM>>(shard_model(r.model, pg, spec));
  r.opt = make(r.root->parameters());
  return r;
}

MakeOptimizer adamw() {
  return [](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(std::move(p), torch::optim::AdamWOptions(1e-2));
  };
}

// The optimizer's state, every tensor gathered whole (collective), scalars as they are.
Full full_optimizer_state(Run& r, const ProcessGroupPtr& pg) {
  Full out;
  for (const auto& [name, t] : get_optimizer_state_dict(*r.model, *r.opt)) {
    if (t.replicated) {
      out[name] = t.local.clone();
    } else {
      out[name] = gather_full(pg, t.local, t.global_shape[0]);
    }
  }
  return out;
}

TEST(StateDict, ShardedHasRowsAndNeedsNoCommunication) {
  TrainSpec spec;
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        std::map<std::string, std::vector<int64_t>> shapes;
        for (const auto& p : model->named_parameters()) shapes[p.key()] = p.value().sizes().vec();
        auto root = shard_model(model, pg);
        pg->reset_stats();
        auto sd = get_model_state_dict(*model);
        EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 0);
        ASSERT_EQ(sd.size(), shapes.size());
        for (const auto& [name, t] : sd) {
          EXPECT_EQ(t.global_shape, shapes.at(name)) << name;
          const auto rows = shard_range(t.global_shape[0], 3, pg->rank());
          EXPECT_EQ(t.row_offset, rows.begin) << name;
          EXPECT_EQ(t.rows(), rows.rows()) << name;
          EXPECT_FALSE(t.replicated);
          EXPECT_TRUE(t.local.is_same(model->named_parameters()[name])) << "the live shard";
        }
      },
      test_options());
}

TEST(StateDict, FullEqualsTheUnshardedModel) {
  TrainSpec spec;
  const auto want = unsharded_params(spec);
  for (int world : {1, 2, 3, 4}) {
    for (bool rank0_only : {false, true}) {
      run_local_ranks(
          world,
          [&](const ProcessGroupPtr& pg) {
            auto model = build_model(spec);
            auto root = shard_model(model, pg);
            FullStateDictOptions options;
            options.rank0_only = rank0_only;
            pg->reset_stats();
            auto full = to_map(get_full_model_state_dict(*model, pg, options));
            EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather),
                      static_cast<int64_t>(want.size()))
                << "one gather per tensor";
            if (rank0_only && pg->rank() != 0) {
              EXPECT_TRUE(full.empty());
            } else {
              expect_equal(full, want, "world " + std::to_string(world));
            }
          },
          test_options());
    }
  }
}

// Sharded at 4, set at 2 (each new rank gives the rows of two old ones), at 3 (rank 0 gives
// every row, the others none) and into an unsharded model: the trained values arrive.
TEST(StateDict, ShardedRoundTripsReshard) {
  TrainSpec spec;
  Full saved;
  std::vector<ShardedStateDict> shards(4);
  std::mutex mu;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, pg, adamw());
        train_steps(r, spec, pg, 0, 2);
        auto full = to_map(get_full_model_state_dict(*r.model, pg));
        std::lock_guard<std::mutex> lock(mu);
        for (auto& [name, t] : get_model_state_dict(*r.model)) {
          t.local = t.local.detach().clone();  // this rank's rows, kept past the run
          shards[pg->rank()].emplace_back(name, t);
        }
        if (pg->rank() == 0) saved = full;
      },
      test_options());
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec other = spec;
        other.seed = 99;
        auto model = build_model(other);
        auto root = shard_model(model, pg);
        ShardedStateDict mine;
        const auto& a = shards[2 * pg->rank()];
        const auto& b = shards[2 * pg->rank() + 1];
        for (size_t i = 0; i < a.size(); ++i) {
          ShardedTensor t = a[i].second;
          t.local = at::cat({a[i].second.local, b[i].second.local});
          mine.emplace_back(a[i].first, t);
        }
        set_model_state_dict(*model, mine, pg);
        auto full = to_map(get_full_model_state_dict(*model, pg));
        if (pg->rank() == 0) expect_equal(full, saved, "4 -> 2");
      },
      test_options());
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec other = spec;
        other.seed = 98;
        auto model = build_model(other);
        auto root = shard_model(model, pg);
        ShardedStateDict mine;
        for (const auto& [name, t] : saved) {
          ShardedTensor s;
          s.global_shape = t.sizes().vec();
          auto shape = s.global_shape;
          if (pg->rank() != 0) shape[0] = 0;
          s.local = pg->rank() == 0 ? t : at::empty(shape, t.options());
          mine.emplace_back(name, s);
        }
        set_model_state_dict(*model, mine, pg);
        auto full = to_map(get_full_model_state_dict(*model, pg));
        if (pg->rank() == 0) expect_equal(full, saved, "all rows on rank 0 -> 3");
      },
      test_options());
  // Into an unsharded model (one rank): a full dict.
  TrainSpec other = spec;
  other.seed = 97;
  auto model = build_model(other);
  FullStateDict full(saved.begin(), saved.end());
  set_model_state_dict(*model, full, make_local_groups(1).front());
  Full got;
  for (const auto& p : model->named_parameters()) got[p.key()] = p.value().detach();
  expect_equal(got, saved, "into an unsharded model");
}

TEST(StateDict, FullRank0OnlyIsBroadcast) {
  TrainSpec spec;
  const auto want = unsharded_params(spec);
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec other = spec;
        other.seed = 5;
        auto model = build_model(other);
        auto root = shard_model(model, pg);
        FullStateDict full;
        if (pg->rank() == 0) full.assign(want.begin(), want.end());
        set_model_state_dict(*model, full, pg, /*rank0_only=*/true);
        auto got = to_map(get_full_model_state_dict(*model, pg));
        if (pg->rank() == 0) expect_equal(got, want, "rank0_only");
      },
      test_options());
}

TEST(StateDict, MismatchesAreRefusedOnEveryRankBeforeAnyChange) {
  TrainSpec spec;
  const auto want = unsharded_params(spec);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        auto root = shard_model(model, pg);
        const auto before = to_map(get_full_model_state_dict(*model, pg));
        auto first = want.begin()->first;
        FullStateDict missing(std::next(want.begin()), want.end());
        expect_error_containing<InvalidArgument>([&] { set_model_state_dict(*model, missing, pg); },
                                                 "has no '" + first + "'");
        FullStateDict extra(want.begin(), want.end());
        extra.emplace_back("not.a.parameter", at::zeros({2}));
        expect_error_containing<InvalidArgument>([&] { set_model_state_dict(*model, extra, pg); },
                                                 "'not.a.parameter'");
        FullStateDict wrong(want.begin(), want.end());
        wrong[0].second = at::zeros({3, 3});
        expect_error_containing<InvalidArgument>([&] { set_model_state_dict(*model, wrong, pg); },
                                                 "[3, 3]");
        expect_equal(to_map(get_full_model_state_dict(*model, pg)), before, "unchanged");
      },
      test_options());
}

// The optimizers beyond AdamW and SGD: their state and options survive a checkpoint saved at 4
// and loaded at 4, 2 and 3: equal bit for bit, and one more step from the loaded state gives
// the next step of the uninterrupted run (exactly at the same world size).
struct OptimizerCase {
  std::string name;
  MakeOptimizer make;
};

class OptimizerResume : public ::testing::TestWithParam<OptimizerCase> {};

std::string scratch_dir(const std::string& tag) {
  std::string dir = "/tmp/fsdp_state_dict_" + tag + "_" + std::to_string(::getpid());
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

TEST_P(OptimizerResume, ExactlyAcrossAReshard) {
  const auto c = GetParam();
  TrainSpec spec;
  // Another world size reorders the gradients' sums; the key bias's gradient is zero up to
  // rounding, which Adam-like optimizers turn into lr-sized steps (train_harness.h).
  spec.edit_model = freeze_attention_bias;
  const auto dir = scratch_dir(c.name);
  Full saved_state, after_three;
  std::string path;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, pg, c.make);
        train_steps(r, spec, pg, 0, 2);
        auto state = full_optimizer_state(r, pg);
        auto p = save_checkpoint(dir, 2, *r.model, r.opt.get(), pg);
        train_steps(r, spec, pg, 2, 3);
        auto params = to_map(get_full_model_state_dict(*r.model, pg));
        if (pg->rank() == 0) saved_state = state, path = p, after_three = params;
      },
      test_options());
  ASSERT_FALSE(saved_state.empty());
  for (int world : {4, 2, 3}) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          TrainSpec other = spec;
          other.seed = 77;  // every value must come from the checkpoint
          auto r = make_run(other, pg, c.make);
          r.opt->param_groups()[0].options().set_lr(123.0);
          train_steps(r, other, pg, 0, 1);  // some state of its own, to be replaced
          load_checkpoint(path, *r.model, r.opt.get(), pg);
          EXPECT_NE(r.opt->param_groups()[0].options().get_lr(), 123.0) << "options restored";
          auto state = full_optimizer_state(r, pg);
          train_steps(r, spec, pg, 2, 3);
          auto params = to_map(get_full_model_state_dict(*r.model, pg));
          if (pg->rank() != 0) return;
          expect_equal(state, saved_state, c.name + " state at world " + std::to_string(world));
          for (const auto& [name, t] : after_three) {
            const double err = (params.at(name) - t).abs().max().item<double>() /
                               std::max(t.abs().max().item<double>(), 1e-12);
            if (world == 4) {
              EXPECT_EQ(err, 0.0) << c.name << " " << name << ": the same world resumes exactly";
            } else {
              EXPECT_LT(err, 1e-5) << c.name << " " << name << " at world " << world;
            }
          }
        },
        test_options());
  }
  std::string cmd = "rm -rf '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, OptimizerResume,
    ::testing::Values(
        OptimizerCase{"adam_amsgrad",
                      [](std::vector<at::Tensor> p) {
                        return std::make_unique<torch::optim::Adam>(
                            std::move(p), torch::optim::AdamOptions(1e-2).amsgrad(true));
                      }},
        OptimizerCase{"rmsprop_centered_momentum",
                      [](std::vector<at::Tensor> p) {
                        return std::make_unique<torch::optim::RMSprop>(
                            std::move(p),
                            torch::optim::RMSpropOptions(1e-3).centered(true).momentum(0.9));
                      }},
        OptimizerCase{
            "adagrad",
            [](std::vector<at::Tensor> p) {
              return std::make_unique<torch::optim::Adagrad>(
                  std::move(p),
                  torch::optim::AdagradOptions(1e-2).lr_decay(1e-3).initial_accumulator_value(0.1));
            }},
        OptimizerCase{"fused_adamw",
                      [](std::vector<at::Tensor> p) {
                        return std::make_unique<FusedAdamW>(std::move(p),
                                                            torch::optim::AdamWOptions(1e-2));
                      }}),
    [](const auto& info) { return info.param.name; });

// In memory: the optimizer's sharded dict at 4 set at 3 with all rows on rank 0.
TEST(StateDict, OptimizerStateReshardsInMemory) {
  TrainSpec spec;
  Full saved;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, pg, adamw());
        train_steps(r, spec, pg, 0, 2);
        auto s = full_optimizer_state(r, pg);
        if (pg->rank() == 0) saved = s;
      },
      test_options());
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, pg, adamw());
        ShardedStateDict mine;
        for (const auto& [name, t] : saved) {
          ShardedTensor s;
          s.global_shape = t.sizes().vec();
          // Scalars ("#step") and the optimizer's own entries are every rank's.
          s.replicated = t.dim() == 0 || name.rfind('#', 0) == 0;
          if (s.replicated) {
            s.local = t;
          } else {
            auto shape = t.sizes().vec();
            if (pg->rank() != 0) shape[0] = 0;
            s.local = pg->rank() == 0 ? t : at::empty(shape, t.options());
          }
          mine.emplace_back(name, s);
        }
        set_optimizer_state_dict(*r.model, *r.opt, mine, pg);
        auto got = full_optimizer_state(r, pg);
        if (pg->rank() == 0) expect_equal(got, saved, "optimizer 4 -> 3 in memory");
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
