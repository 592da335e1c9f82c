// Communication hooks (FSDPModule::set_custom_all_gather, set_custom_reduce_scatter,
// set_all_reduce_hook; fsdp/runtime/comm_hooks.h) and the quantized weight all-gather built on
// them (ZeRO++'s qwZ).
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "support/train_harness.h"

namespace fsdp::testing {
// Named, not anonymous: the unity build may put this file beside another test's Run and train.
namespace comm_hooks_test {

struct Run {
  TinyLM model{nullptr};
  Unit<TinyLM> root;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Run make_run(const TrainSpec& spec, const ProcessGroupPtr& pg) {
  Run r;
  r.model = build_model(spec);
  r.root = shard_model(r.model, pg, spec);
  r.opt = std::make_unique<torch::optim::AdamW>(r.root.parameters(),
                                                torch::optim::AdamWOptions(spec.lr));
  return r;
}

// Every unit of the model: the blocks and the root.
std::vector<FSDPModule> units_of(Run& r) {
  std::vector<FSDPModule> out{r.root};
  for (auto& layer : r.model->layers) out.push_back(layer);
  return out;
}

double backward_once(Run& r, const TrainSpec& spec, const ProcessGroupPtr& pg, int step) {
  const int64_t local = spec.batch / pg->size();
  auto [tokens, targets] = global_batch(spec, step);
  r.opt->zero_grad();
  auto loss = loss_of(r.root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                      spec.model.output_size());
  loss.backward();
  auto global = loss.detach().reshape({1}).clone();
  pg->all_reduce(global, ReduceOp::kAvg)->wait();
  return global.item<double>();
}

std::vector<double> train(Run& r, const TrainSpec& spec, const ProcessGroupPtr& pg) {
  std::vector<double> losses;
  for (int step = 0; step < spec.steps; ++step) {
    losses.push_back(backward_once(r, spec, pg, step));
    r.opt->step();
  }
  return losses;
}

std::vector<at::Tensor> full_params(Run& r, const ProcessGroupPtr& pg) {
  std::vector<at::Tensor> out;
  for (const auto& [name, t] : get_full_model_state_dict(*r.model, pg)) out.push_back(t);
  return out;
}

class CommHooks : public ::testing::TestWithParam<int> {};

// Hooks that forward to the group's own collectives train bit for bit as without hooks, and
// every collective of every unit went through them: the calls counted by the hooks are the
// group's whole count of that kind.
TEST_P(CommHooks, HooksThatCallTheGroupTrainAsWithout) {
  const int world = GetParam();
  TrainSpec spec;
  spec.steps = 3;
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, pg);
        const auto want = train(plain, spec, pg);

        auto hooked = make_run(spec, pg);
        int gathers = 0, reductions = 0, hooks = 0;
        for (auto& u : units_of(hooked)) {
          u.set_custom_all_gather([&](const at::Tensor& out, const at::Tensor& in, ProcessGroup& g,
                                      const std::vector<int64_t>& offsets) {
            ++gathers;
            EXPECT_EQ(out.numel(), g.size() * in.numel());
            EXPECT_FALSE(offsets.empty());
            EXPECT_EQ(offsets.front(), 0);
            EXPECT_TRUE(std::is_sorted(offsets.begin(), offsets.end()));
            EXPECT_LT(offsets.back(), in.numel());
            return g.all_gather(out, in);
          });
          u.set_custom_reduce_scatter(
              [&](const at::Tensor& out, const at::Tensor& in, ProcessGroup& g, ReduceOp op) {
                ++reductions;
                EXPECT_EQ(op, g.size() == 1 ? ReduceOp::kSum : ReduceOp::kAvg);
                return g.reduce_scatter(out, in, op);
              });
          u.set_all_reduce_hook([&](const at::Tensor&) { ++hooks; });
        }
        const auto before = pg->stats();
        const auto got = train(hooked, spec, pg);
        const auto after = pg->stats();
        EXPECT_EQ(got, want);
        const auto a = full_params(hooked, pg), b = full_params(plain, pg);
        for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], b[i])) << i;
        // Three units, each gathered for forward and (but the root) for backward, each reduced
        // once per step; the loss's all-reduce is not a unit's.
        EXPECT_EQ(gathers, spec.steps * 5);
        EXPECT_EQ(reductions, spec.steps * 3);
        EXPECT_EQ(hooks, spec.steps * 3);
        EXPECT_EQ(
            after.count(CollectiveKind::kAllGather) - before.count(CollectiveKind::kAllGather),
            gathers);
        EXPECT_EQ(after.count(CollectiveKind::kReduceScatter) -
                      before.count(CollectiveKind::kReduceScatter),
                  reductions);
      },
      test_options());
}

// A reduce-scatter replaced by an all-reduce and a slice (another algorithm, the same sum) gives
// the default's gradients up to the order of additions; the group's reduce-scatter is never
// called. An empty function restores the default.
TEST_P(CommHooks, ReduceScatterReplacedByAnAllReduce) {
  const int world = GetParam();
  TrainSpec spec;
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, pg);
        backward_once(plain, spec, pg, 0);
        auto hooked = make_run(spec, pg);
        for (auto& u : units_of(hooked)) {
          u.set_custom_reduce_scatter(
              [](const at::Tensor& out, const at::Tensor& in, ProcessGroup& g, ReduceOp op) {
                auto all = in.clone();
                g.all_reduce(all, op)->wait();
                out.copy_(all.view({g.size(), -1})[g.rank()]);
                return WorkPtr();  // finished already
              });
        }
        const auto before = pg->stats().count(CollectiveKind::kReduceScatter);
        backward_once(hooked, spec, pg, 0);
        EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), before);
        const auto a = hooked.root.parameters(), b = plain.root.parameters();
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::allclose(a[i].grad(), b[i].grad(), 1e-6, 1e-7)) << i;
        }
        for (auto& u : units_of(hooked)) u.set_custom_reduce_scatter({});
        backward_once(hooked, spec, pg, 0);
        // (One rank in its own dtype reduces nothing by default.)
        if (world > 1) {
          EXPECT_GT(pg->stats().count(CollectiveKind::kReduceScatter), before);
        }
      },
      test_options());
}

// The all-reduce hook runs on the reduced shard before a divide factor divides it (FSDP2's
// order): doubling there doubles the gradients, and with a factor the hook sees the sum. At
// world 1 it runs too (the one-rank path, which reduces nothing, is left).
TEST_P(CommHooks, AllReduceHookSeesTheReducedShardBeforeTheFactor) {
  const int world = GetParam();
  TrainSpec spec;
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, pg);
        backward_once(plain, spec, pg, 0);
        auto hooked = make_run(spec, pg);
        for (auto& u : units_of(hooked)) {
          u.set_all_reduce_hook([](const at::Tensor& reduced) { reduced.mul_(2); });
        }
        backward_once(hooked, spec, pg, 0);
        const auto a = hooked.root.parameters(), b = plain.root.parameters();
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(at::allclose(a[i].grad(), b[i].grad() * 2, 1e-6, 1e-7)) << i;
        }
        // Sum then divide by the world: the average again; the hook saw world times as much.
        auto factor = make_run(spec, pg);
        double seen = 0;
        for (auto& u : units_of(factor)) {
          u.set_gradient_divide_factor(world);
          u.set_all_reduce_hook(
              [&](const at::Tensor& reduced) { seen += reduced.abs().sum().item<double>(); });
        }
        backward_once(factor, spec, pg, 0);
        double plain_sum = 0;
        const auto c = factor.root.parameters();
        for (size_t i = 0; i < c.size(); ++i) {
          EXPECT_TRUE(at::allclose(c[i].grad(), b[i].grad(), 1e-6, 1e-7)) << i;
          plain_sum += b[i].grad().abs().sum().item<double>();
        }
        EXPECT_NEAR(seen, world * plain_sum, 1e-4 * world * plain_sum);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Worlds, CommHooks, ::testing::Values(1, 2, 4));

TEST(CommHooksErrors, RefusedOnAModuleNotSharded) {
  auto model = build_model(TrainSpec{});
  FSDPModule plain(model.ptr());
  EXPECT_THROW(plain.set_custom_all_gather(quantized_all_gather()), InvalidArgument);
  EXPECT_THROW(quantized_all_gather({3}), InvalidArgument);
  EXPECT_THROW(quantized_all_gather({0}), InvalidArgument);
  EXPECT_THROW(quantized_all_gather({(1 << 20) + 4}), InvalidArgument);
}

// The hook alone: each rank's values come back within half a step of its block's scale, every
// rank receives the same, and one rank sends n + 4 * ceil(n / block) bytes (uint8): about a
// quarter of float32's, half of bfloat16's.
TEST(QuantizedAllGather, RoundsEachBlockAndSendsAQuarterOfTheBytes) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const int world = 3;
    const int64_t n = 1000, block = 64;
    std::vector<at::Tensor> results(world);
    std::vector<int64_t> bytes(world);
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          auto gen = at::make_generator<at::CPUGeneratorImpl>(100 + pg->rank());
          auto input = (at::randn({n}, gen) * (pg->rank() + 1)).to(dtype);
          input[7] = 0;
          auto output = at::empty({world * n}, input.options());
          const auto before = pg->stats().bytes_of(CollectiveKind::kAllGather);
          auto hook = quantized_all_gather({block});
          hook(output, input, *pg, {0})->wait();
          bytes[pg->rank()] = pg->stats().bytes_of(CollectiveKind::kAllGather) - before;
          results[pg->rank()] = output;
          // Own block: within half a quantization step of the input.
          auto got = output.narrow(0, pg->rank() * n, n).to(at::kFloat);
          auto want = input.to(at::kFloat);
          auto blocks = want.narrow(0, 0, 960).view({15, block});
          auto step = blocks.abs().amax(1) / 127;
          auto err = (got.narrow(0, 0, 960).view({15, block}) - blocks).abs();
          const double slack =
              dtype == at::kFloat ? 1e-6 : 0.5;  // bf16 rounds to 2^-8: 127 / 256 steps
          EXPECT_TRUE((err <= step.unsqueeze(1) * (0.5 + slack) + 1e-7).all().item<bool>())
              << c10::toString(dtype) << ": worst error "
              << (err / step.unsqueeze(1)).max().item<double>() << " steps";
          EXPECT_EQ(got[7].item<float>(), 0.0f);
        },
        test_options());
    for (int r = 1; r < world; ++r) EXPECT_TRUE(at::equal(results[r], results[0]));
    const int64_t want_bytes = 16 * block + 16 * 4;  // 1000 padded to 16 blocks, 16 scales
    EXPECT_EQ(bytes[0], want_bytes);
    EXPECT_EQ(quantized_all_gather_bytes({n}, {block}), want_bytes);
    EXPECT_LT(static_cast<double>(bytes[0]) / (n * 4), 0.28);  // 0.25 + scales + padding
  }
}

// Blocks stop at each parameter's end: a bias near 1e-3 after a weight near 1 keeps its values
// (within half its own step); in a block shared with the weight it would round to 0.
TEST(QuantizedAllGather, BlocksDoNotSpanParameters) {
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto gen = at::make_generator<at::CPUGeneratorImpl>(5 + pg->rank());
        auto input = at::cat({at::randn({100}, gen), at::randn({20}, gen) * 1e-3});
        auto output = at::empty({2 * 120}, input.options());
        quantized_all_gather({256})(output, input, *pg, {0, 100})->wait();
        auto bias = input.narrow(0, 100, 20), got = output.narrow(0, pg->rank() * 120 + 100, 20);
        const double step = bias.abs().max().item<double>() / 127;
        EXPECT_LE((got - bias).abs().max().item<double>(), step * 0.5 + 1e-9);
        EXPECT_GT(got.abs().max().item<double>(), 0) << "a small parameter was rounded to 0";
        // One block over both: the bias is lost, which is what the offsets prevent.
        quantized_all_gather({256})(output, input, *pg, {0})->wait();
        EXPECT_EQ(output.narrow(0, pg->rank() * 120 + 100, 20).abs().max().item<double>(), 0);
        EXPECT_EQ(quantized_all_gather_bytes({100, 20}, {256}), 2 * 256 + 2 * 4);
      },
      test_options());
}

// Training with quantized weights stays close to the unquantized curve, the shards keep full
// precision (the ranks' gathered weights are equal), and the all-gathers move about a quarter
// of the bytes.
TEST(QuantizedAllGather, TrainsCloseToTheUnquantizedCurve) {
  TrainSpec spec;
  spec.steps = 6;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto plain = make_run(spec, pg);
        auto b0 = pg->stats().bytes_of(CollectiveKind::kAllGather);
        const auto want = train(plain, spec, pg);
        const auto plain_bytes = pg->stats().bytes_of(CollectiveKind::kAllGather) - b0;
        auto quant = make_run(spec, pg);
        for (auto& u : units_of(quant)) u.set_custom_all_gather(quantized_all_gather());
        b0 = pg->stats().bytes_of(CollectiveKind::kAllGather);
        const auto got = train(quant, spec, pg);
        const auto quant_bytes = pg->stats().bytes_of(CollectiveKind::kAllGather) - b0;
        double worst = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
        }
        EXPECT_LT(worst, 2e-2);
        EXPECT_GT(worst, 0) << "the weights were not rounded";
        const double ratio = static_cast<double>(quant_bytes) / plain_bytes;
        EXPECT_GT(ratio, 0.25);
        EXPECT_LT(ratio, 0.30);
        if (pg->rank() == 0) {
          std::printf(
              "quantized all-gather: worst relative loss difference %.2e, bytes %.3f of "
              "fp32\n",
              worst, ratio);
        }
      },
      test_options());
}

}  // namespace comm_hooks_test
}  // namespace fsdp::testing
