// The planner (fsdp/tools/planner.h) against what the runtime does: MiniLLM's activation count
// against the bytes its forward really keeps (counted by the host tensor allocator), and each
// plan's shards, gathered parameters, communication buffers and collectives against the
// runtime's own accounting after a real step on thread ranks; bad requests are named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "fsdp/models/minillm_plan.h"
#include "fsdp/tools/memory.h"
#include "fsdp/tools/planner.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

using plan::make_plan;
using plan::Op;
using plan::PlanRequest;

// The counting allocator must see every tensor of a test; installed once, before any.
class HostTensors : public ::testing::Environment {
 public:
  void SetUp() override { track_host_tensor_memory(); }
};
const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new HostTensors);

int64_t allocated() { return host_tensor_memory().allocated; }

struct BlockCase {
  int64_t dim, heads, seq, batch;
  at::ScalarType dtype;
};

class BlockActivations : public ::testing::TestWithParam<BlockCase> {};

// What a block's forward keeps (its output included) is what block_activation_bytes counts,
// to 1%: the count names every saved tensor, so a change in the ops shows here first.
TEST_P(BlockActivations, MatchTheOpByOpCount) {
  const auto c = GetParam();
  fsdp::models::minillm::Config cfg;
  cfg.dim = c.dim;
  cfg.heads = c.heads;
  fsdp::models::minillm::TransformerBlock block(c.dim, c.heads);
  block->to(c.dtype);
  auto x = at::randn({c.batch, c.seq, c.dim}, at::TensorOptions().dtype(c.dtype))
               .set_requires_grad(true);
  const int64_t before = allocated();
  auto y = block->forward(x);
  const int64_t kept = allocated() - before;
  const int64_t want = fsdp::models::minillm::block_activation_bytes(
      cfg, c.batch * c.seq, c.seq, static_cast<int>(at::elementSize(c.dtype)));
  EXPECT_NEAR(static_cast<double>(kept), static_cast<double>(want), 0.01 * want)
      << "kept " << kept << " bytes, counted " << want;
  y.sum().backward();  // the graph is real and complete
  EXPECT_TRUE(x.grad().defined());
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockActivations,
                         ::testing::Values(BlockCase{64, 4, 32, 2, at::kFloat},
                                           BlockCase{96, 6, 16, 3, at::kFloat},
                                           BlockCase{128, 8, 64, 1, at::kFloat},
                                           BlockCase{64, 4, 32, 2, at::kBFloat16},
                                           BlockCase{96, 6, 16, 3, at::kBFloat16}));

// The root's forward and the loss keep the embedding's output, the logits and the
// log-probabilities.
TEST(RootActivations, MatchTheCount) {
  fsdp::models::minillm::Config cfg;
  cfg.vocab = 500;
  cfg.dim = 64;
  cfg.layers = 0;
  fsdp::models::minillm::MiniLLM model(cfg);
  const int64_t batch = 3, seq = 16;
  auto tokens = at::randint(cfg.vocab, {batch, seq}, at::kLong);
  auto targets = at::randint(cfg.vocab, {batch, seq}, at::kLong);
  const int64_t before = allocated();
  auto logits = model->forward(tokens);
  auto loss =
      at::cross_entropy_loss(logits.reshape({-1, cfg.vocab}).to(at::kFloat), targets.reshape(-1));
  const int64_t kept = allocated() - before;
  const int64_t want = fsdp::models::minillm::root_activation_bytes(cfg, batch * seq, 4);
  EXPECT_NEAR(static_cast<double>(kept), static_cast<double>(want), 0.01 * want)
      << "kept " << kept << " bytes, counted " << want;
}

PlanRequest tiny_request(const TrainSpec& spec, int world, int replicas) {
  fsdp::models::minillm::PlanShape shape;
  shape.model = spec.model;
  shape.seq = spec.seq;
  shape.batch_per_rank = spec.batch / world;
  PlanRequest r;
  r.units = fsdp::models::minillm::plan_units(shape);
  r.layout = {world, replicas, 0};
  return r;
}

struct LayoutCase {
  int world, replicas;
  bool keep_blocks = false;  // reshard_after_forward false: blocks stay full until backward
};

class PlanAgainstRuntime : public ::testing::TestWithParam<LayoutCase> {};

// After one real step: the shards, the gathered parameters' peak and every collective's calls
// and bytes are the plan's exactly; the communication buffers alive at once stay within the
// plan's high-water marks.
TEST_P(PlanAgainstRuntime, ShardsGathersAndCollectivesAreExact) {
  const auto c = GetParam();
  TrainSpec spec;
  if (c.keep_blocks) spec.reshard_after_forward = false;
  auto request = tiny_request(spec, c.world, c.replicas);
  for (auto& u : request.units) u.reshard_after_forward = !c.keep_blocks && u.name != "(root)";
  auto plan = make_plan(request);
  run_local_ranks(
      c.world,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, c.replicas);
        auto model = build_model(spec);
        auto root = shard_model(model, mesh, spec);
        pg->reset_stats();
        auto [tokens, targets] = global_batch(spec, 0);
        const int64_t local = spec.batch / c.world;
        loss_of(root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                spec.model.output_size())
            .backward();
        if (pg->rank() != 0) return;
        const auto m = root.memory_stats();
        EXPECT_EQ(m.sharded_param_bytes, plan.memory.param_shards);
        EXPECT_EQ(m.sharded_grad_bytes, plan.memory.grad_shards);
        EXPECT_EQ(m.tree.peak_full_param_bytes, plan.memory.gathered_params);
        EXPECT_LE(m.tree.peak_comm_buffer_bytes, plan.memory.comm_buffers);
        EXPECT_GE(m.tree.peak_comm_buffer_bytes, plan.memory.comm_buffers / 2);
        for (const auto& coll : plan.collectives) {
          const auto& stats = coll.group == "shard" ? mesh.shard->stats() : mesh.replicate->stats();
          const auto kind = coll.op == Op::kAllGather       ? CollectiveKind::kAllGather
                            : coll.op == Op::kReduceScatter ? CollectiveKind::kReduceScatter
                                                            : CollectiveKind::kAllReduce;
          // The stats count each call's input; an all-gather's input is 1/shards of its output.
          const int64_t in_bytes =
              coll.op == Op::kAllGather ? coll.bytes_per_step / coll.ranks : coll.bytes_per_step;
          EXPECT_EQ(stats.count(kind), coll.calls_per_step) << plan::op_name(coll.op);
          EXPECT_EQ(stats.bytes_of(kind), in_bytes) << plan::op_name(coll.op);
        }
        if (c.world == 1) {
          EXPECT_TRUE(plan.collectives.empty());
        }
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Layouts, PlanAgainstRuntime,
                         ::testing::Values(LayoutCase{1, 1}, LayoutCase{2, 1}, LayoutCase{3, 1},
                                           LayoutCase{4, 1}, LayoutCase{4, 2}, LayoutCase{4, 4},
                                           LayoutCase{2, 1, true}, LayoutCase{4, 2, true}));

// Explicit prefetch of k units ahead (set_modules_to_forward/backward_prefetch): the plan
// follows it (gathers_ahead = k) and bounds the buffers the runtime keeps alive; the default
// plan (one ahead) falls short of them once k prefetched gathers outweigh its margin.
class ExplicitPrefetch : public ::testing::TestWithParam<int> {};

TEST_P(ExplicitPrefetch, PlanFollowsTheLists) {
  const int k = GetParam();
  TrainSpec spec;
  spec.model.layers = 8;
  const int world = 2;
  auto request = tiny_request(spec, world, 1);
  const auto one_ahead = make_plan(request);
  request.gathers_ahead = k;
  const auto k_ahead = make_plan(request);
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        auto root = shard_model(model, pg, spec);
        auto& layers = model->layers;
        const int n = static_cast<int>(layers.size());
        std::vector<FSDPModule> first;
        for (int j = 0; j < k && j < n; ++j) first.push_back(layers[j]);
        root.set_modules_to_forward_prefetch(first);
        for (int i = 0; i < n; ++i) {
          std::vector<FSDPModule> ahead, behind;
          for (int j = 1; j <= k; ++j) {
            if (i + j < n) ahead.push_back(layers[i + j]);
            if (i - j >= 0) behind.push_back(layers[i - j]);
          }
          layers[i].set_modules_to_forward_prefetch(ahead);
          layers[i].set_modules_to_backward_prefetch(behind);
        }
        auto [tokens, targets] = global_batch(spec, 0);
        const int64_t local = spec.batch / world;
        loss_of(root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                spec.model.output_size())
            .backward();
        const auto m = root.memory_stats();
        EXPECT_LE(m.tree.peak_comm_buffer_bytes, k_ahead.memory.comm_buffers);
        EXPECT_GE(m.tree.peak_comm_buffer_bytes, k_ahead.memory.comm_buffers / 2);
        // Measured: each unit prefetched more keeps one more block's buffers alive, 261360
        // bytes here, beyond the one-ahead plan's margin from k = 3.
        if (k >= 3) {
          EXPECT_GT(m.tree.peak_comm_buffer_bytes, one_ahead.memory.comm_buffers);
        }
        EXPECT_EQ(m.tree.peak_full_param_bytes, k_ahead.memory.gathered_params);
      },
      test_options());
}

INSTANTIATE_TEST_SUITE_P(Depths, ExplicitPrefetch, ::testing::Values(1, 2, 3, 4));

TEST(PlanErrors, GathersAheadIsNotNegative) {
  auto request = tiny_request(TrainSpec{}, 2, 1);
  request.gathers_ahead = -1;
  expect_error_containing<InvalidArgument>([&] { make_plan(request); },
                                           "gathers_ahead must be >= 0, got -1");
}

TEST(PlanErrors, NameTheNumbers) {
  TrainSpec spec;
  expect_error_containing<InvalidArgument>([&] { make_plan(tiny_request(spec, 4, 3)); },
                                           "3 replicas do not divide a world of 4 ranks");
  auto r = tiny_request(spec, 4, 1);
  r.layout.ranks_per_host = 3;
  expect_error_containing<InvalidArgument>([&] { make_plan(r); },
                                           "3 ranks per host do not divide a world of 4 ranks");
  r = tiny_request(spec, 2, 1);
  r.capacity_bytes = 1 << 20;
  expect_error_containing<plan::PlanError>([&] { make_plan(r); }, "does not fit: a rank needs");
  expect_error_containing<plan::PlanError>([&] { make_plan(r); }, "but has 0.00 GiB; 2 ranks");
  // A measured table without the group size asked for names it.
  const std::string path = "/tmp/fsdp_plan_table_" + std::to_string(::getpid()) + ".csv";
  {
    std::ofstream out(path);
    out << "op,ranks,bytes,seconds\nall_gather,2,4096,0.00001\nall_gather,2,1048576,0.0004\n";
  }
  r = tiny_request(spec, 2, 1);
  r.comm = plan::CommModel::measured(path);
  expect_error_containing<plan::PlanError>([&] { make_plan(r); },
                                           "has no reduce_scatter over 2 ranks");
  // Interpolation between measured sizes is log-log: halfway in log size, halfway in log time.
  // 65536 is halfway between 4096 and 1048576 in log size: sqrt of the time ratio 40.
  EXPECT_NEAR(r.comm.seconds(Op::kAllGather, 2, 65536, false), 0.00001 * std::sqrt(40.0), 1e-12);
  std::remove(path.c_str());
  expect_error_containing<plan::PlanError>(
      [&] { plan::CommModel::measured("/nonexistent/table.csv"); },
      "cannot read the collectives table /nonexistent/table.csv");
}

}  // namespace
}  // namespace fsdp::testing
