// CPU offload (FullyShardOptions::offload_policy, FSDP2's CPUOffloadPolicy) and the optimizer's
// state offload (FusedAdamW::set_state_offload): on a machine without a GPU the host is the
// device and the same copies run (host to host), so training must be bit for bit the training
// without offload, at every world size, in fp32 and in bf16, and through a checkpoint. On a GPU
// the copies cross the bus (scripts/gpu_check.sh's offload stage measures them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

enum class Offload { kNone, kParams, kOptimizerState, kBoth };

const char* name_of(Offload o) {
  switch (o) {
    case Offload::kNone:
      return "none";
    case Offload::kParams:
      return "params";
    case Offload::kOptimizerState:
      return "optimizer_state";
    case Offload::kBoth:
      return "both";
  }
  return "?";
}

struct Run {
  TinyLM model{nullptr};
  Unit<TinyLM> root;
  std::unique_ptr<FusedAdamW> opt;
};

Run make_run(TrainSpec spec, Offload offload, const ProcessGroupPtr& pg) {
  if (offload == Offload::kParams || offload == Offload::kBoth) spec.offload = CPUOffloadPolicy{};
  Run r;
  r.model = build_model(spec);
  r.root = shard_model(r.model, pg, spec);
  r.opt = std::make_unique<FusedAdamW>(r.root.parameters(), torch::optim::AdamWOptions(spec.lr));
  if (offload == Offload::kOptimizerState || offload == Offload::kBoth) {
    r.opt->set_state_offload(true);
  }
  return r;
}

std::vector<double> train(Run& r, const TrainSpec& spec, const ProcessGroupPtr& pg, int from,
                          int to) {
  std::vector<double> losses;
  const int64_t local = spec.batch / pg->size();
  for (int step = from; step < to; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    r.opt->zero_grad();
    auto loss = loss_of(r.root(tokens.narrow(0, pg->rank() * local, local)),
                        targets.narrow(0, pg->rank() * local, local), spec.model.output_size());
    loss.backward();
    r.opt->step();
    auto global = loss.detach().reshape({1}).clone();
    pg->all_reduce(global, ReduceOp::kAvg)->wait();
    losses.push_back(global.item<double>());
  }
  return losses;
}

std::vector<at::Tensor> full_params(Run& r, const ProcessGroupPtr& pg) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : get_full_model_state_dict(*r.model, pg)) out.push_back(t);
  return out;
}

struct Case {
  int world;
  Offload offload;
  bool bf16;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "world " << c.world << ", offload " << name_of(c.offload) << (c.bf16 ? ", bf16" : "");
}

class OffloadParity : public ::testing::TestWithParam<Case> {};

// Offloaded training equals training without offload, bit for bit: the copies are exact and the
// arithmetic is the same (world 1 included, where offload turns off the one-rank fast path).
// The shards, their gradients and the optimizer's state are host tensors.
TEST_P(OffloadParity, BitForBitTheTrainingWithout) {
  const auto c = GetParam();
  TrainSpec spec;
  spec.steps = 4;
  if (c.bf16) {
    spec.mp.param_dtype = at::kBFloat16;
    spec.mp.reduce_dtype = at::kFloat;
  }
  run_local_ranks(
      c.world,
      [&](const ProcessGroupPtr& pg) {
        pg->barrier()->wait();
        auto plain = make_run(spec, Offload::kNone, pg);
        auto offloaded = make_run(spec, c.offload, pg);
        pg->barrier()->wait();
        const auto want = train(plain, spec, pg, 0, spec.steps);
        const auto got = train(offloaded, spec, pg, 0, spec.steps);
        EXPECT_EQ(got, want);
        const auto a = full_params(offloaded, pg), b = full_params(plain, pg);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
        for (const auto& p : offloaded.root.parameters()) {
          EXPECT_TRUE(p.is_cpu());
          EXPECT_TRUE(p.grad().is_cpu());
        }
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, OffloadParity,
    ::testing::Values(Case{1, Offload::kParams, false}, Case{2, Offload::kParams, false},
                      Case{4, Offload::kParams, false}, Case{2, Offload::kParams, true},
                      Case{1, Offload::kOptimizerState, false},
                      Case{2, Offload::kOptimizerState, false}, Case{4, Offload::kBoth, false}));

// Through a checkpoint: two steps with offload, saved at world 2, loaded at world 4 with
// offload, two more steps: the uninterrupted run's losses, within the reshard's rounding.
TEST(Offload, ResumesThroughACheckpointAtAnotherWorld) {
  TrainSpec spec;
  const std::string dir = "/tmp/fsdp_offload_ckpt_" + std::to_string(::getpid());
  std::system(("rm -rf '" + dir + "'").c_str());
  std::vector<double> uninterrupted, resumed;
  std::string path;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, Offload::kBoth, pg);
        train(r, spec, pg, 0, 2);
        auto p = save_checkpoint(dir, 2, *r.model, r.opt.get(), pg);
        auto rest = train(r, spec, pg, 2, 4);
        if (pg->rank() == 0) path = p, uninterrupted = rest;
      },
      test_options());
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto r = make_run(spec, Offload::kBoth, pg);
        load_checkpoint(path, *r.model, r.opt.get(), pg);
        auto rest = train(r, spec, pg, 2, 4);
        if (pg->rank() == 0) resumed = rest;
      },
      test_options());
  ASSERT_EQ(resumed.size(), uninterrupted.size());
  for (size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_NEAR(resumed[i], uninterrupted[i], 1e-5 * std::abs(uninterrupted[i])) << i;
  }
  std::system(("rm -rf '" + dir + "'").c_str());
}

// A parameter pointed at other memory after sharding (what Module::to does to every parameter
// of a tree on a GPU, host shards included): the values written there since are adopted by the
// next gather, the parameter holds its shard again, and training goes on as if nothing moved.
// A tensor of the wrong shape is refused, naming the unit.
TEST(Offload, ParametersMovedAfterShardingAreAdopted) {
  TrainSpec spec;
  spec.steps = 3;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, Offload::kNone, pg);
        auto moved = make_run(spec, Offload::kParams, pg);
        for (const auto& p : moved.root.parameters()) {
          at::NoGradGuard no_grad;
          p.set_data(p.detach().clone());  // a copy, as a move to another device makes
          ASSERT_FALSE(shard_of(p).has_value());
        }
        const auto want = train(plain, spec, pg, 0, spec.steps);
        const auto got = train(moved, spec, pg, 0, spec.steps);
        EXPECT_EQ(got, want);
        for (const auto& p : moved.root.parameters()) {
          EXPECT_TRUE(shard_of(p).has_value()) << "the parameter holds its shard again";
        }

        // Values written into the replaced tensors are what the next gather sends.
        for (const auto& p : moved.root.parameters()) {
          at::NoGradGuard no_grad;
          p.set_data(at::full_like(p, 0.5));
        }
        moved.root(global_batch(spec, 0).first.narrow(0, 0, 1));
        for (const auto& [name, t] : get_full_model_state_dict(*moved.model, pg)) {
          EXPECT_TRUE(at::equal(t, at::full_like(t, 0.5))) << name;
        }

        auto& first = moved.model->layers[0];
        for (auto& p : first->parameters()) {
          at::NoGradGuard no_grad;
          p.set_data(at::zeros({p.size(0) + 1}, p.options()));
          break;
        }
        try {
          moved.root(global_batch(spec, 0).first.narrow(0, 0, 1));
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("was replaced while sharded by a tensor of shape"),
                    std::string::npos)
              << e.what();
        }
      },
      test_options());
}

// The memory statistics count host shards as shards: the same bytes as without offload, and
// the same full parameters at the peak.
TEST(Offload, MemoryStatsCountTheHostShards) {
  TrainSpec spec;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, Offload::kNone, pg);
        auto offloaded = make_run(spec, Offload::kParams, pg);
        train(plain, spec, pg, 0, 1);
        train(offloaded, spec, pg, 0, 1);
        const auto a = offloaded.root.memory_stats(), b = plain.root.memory_stats();
        EXPECT_EQ(a.sharded_param_bytes, b.sharded_param_bytes);
        EXPECT_EQ(a.sharded_grad_bytes, b.sharded_grad_bytes);
        // World 2 gathers in both: the same full parameters at the peak.
        EXPECT_EQ(a.tree.peak_full_param_bytes, b.tree.peak_full_param_bytes);
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
