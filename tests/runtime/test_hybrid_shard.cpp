// Hybrid sharding (HSDP) over thread ranks: replicas x shards layouts train to the losses and
// parameters of a single process and of plain FSDP; each group carries exactly its
// collectives; clipping, checkpoints and export see each shard once; bad layouts are named.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/comm/device_mesh.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/optim/clip_grad.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

// kFp32Tolerance as the plain parity tests: only the order of float additions differs. With one
// replica or one shard per replica the order is the plain one and the results are bit-identical to
// plain FSDP. Otherwise each gradient is averaged over the shard group, then over the replicas
// ((a + b) / 2 + (c + d) / 2) / 2 instead of (a + b + c + d) / 4: the losses still agree to
// float rounding, and the parameters within what 10 AdamW steps make of gradients that differ
// in their last bit (measured: 1.5e-5 to 1.9e-5 at 2x2, 2x3 and 3x2; test_grad_sync.cpp sees
// the same amplification when accumulation reorders the sums).
constexpr double kReorderedParamTolerance = 1e-4;

struct Layout {
  int replicas, shards;
};
std::string layout_name(const Layout& l) {
  return std::to_string(l.replicas) + "x" + std::to_string(l.shards);
}
std::string test_name(const ::testing::TestParamInfo<Layout>& info) {
  return layout_name(info.param);
}

class HybridParity : public ::testing::TestWithParam<Layout> {};

TEST_P(HybridParity, MatchesSingleProcessAndPlainFsdp) {
  const Layout layout = GetParam();
  const int world = layout.replicas * layout.shards;
  TrainSpec spec;
  // The attention key bias's gradient is zero up to rounding, which AdamW turns into lr-sized
  // steps of either sign once the summation order changes (train_harness.h).
  spec.edit_model = freeze_attention_bias;
  auto want = train_reference(spec, /*slices=*/world);
  ASSERT_LT(want.losses.back(), want.losses.front()) << "the reference must learn something";
  TrainResult plain;
  std::vector<TrainResult> by_rank(world);
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, pg);
        if (pg->rank() == 0) plain = got;
      },
      test_options());
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, layout.replicas);
        EXPECT_EQ(mesh.replicas(), layout.replicas);
        EXPECT_EQ(mesh.shards(), layout.shards);
        EXPECT_EQ(mesh.replica_index(), pg->rank() / layout.shards);
        EXPECT_EQ(mesh.shard_index(), pg->rank() % layout.shards);
        auto got = train_sharded(spec, mesh);
        by_rank[pg->rank()] = got;
        if (pg->rank() != 0) return;
        const bool same_order = layout.replicas == 1 || layout.shards == 1;
        const double param_tolerance = same_order ? kFp32Tolerance : kReorderedParamTolerance;
        expect_parity("hsdp " + layout_name(layout), world, got, want, param_tolerance);
        expect_parity("hsdp vs plain fsdp", world, got, plain, param_tolerance);
        EXPECT_LT(max_rel_loss_error(got, want), kFp32Tolerance);
        if (same_order) {
          EXPECT_EQ(max_rel_param_error(got, plain), 0.0);
        }
      },
      test_options());
  // Every replica ends with the same parameters, bit for bit: they apply the same all-reduced
  // gradient shards.
  for (int r = layout.shards; r < world; r += layout.shards) {
    for (size_t i = 0; i < by_rank[0].params.size(); ++i) {
      EXPECT_TRUE(at::equal(by_rank[r].params[i].second, by_rank[0].params[i].second))
          << "replica " << r / layout.shards << ": " << by_rank[0].params[i].first;
    }
  }
}

// 2x2, 1x4 (plain FSDP through a mesh) and 4x1 (DDP: every rank holds everything) at world 4;
// 2x3 and 3x2 shard a vocabulary of 1001 rows and a head of 3 unevenly.
INSTANTIATE_TEST_SUITE_P(Layouts, HybridParity,
                         ::testing::Values(Layout{2, 2}, Layout{1, 4}, Layout{4, 1}, Layout{2, 3},
                                           Layout{3, 2}),
                         test_name);

TEST(HybridParity, MixedPrecisionMatchesReferenceWithSameCasts) {
  TrainSpec spec;
  spec.mp.param_dtype = at::kBFloat16;
  spec.mp.reduce_dtype = at::kFloat;
  auto want = train_reference(spec, 4);
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto got = train_sharded(spec, make_device_mesh(pg, 2));
        if (pg->rank() == 0) expect_parity("hsdp bf16/fp32", 4, got, want, kFp32Tolerance);
      },
      test_options());
}

// One step's collectives, per group: gathers and reduce-scatters on the shard group, one
// all-reduce per unit on the replicate group (of the reduced shard: 1/shards of the
// reduce-scatter's input), nothing on the world group; none of them while gradient sync is
// off.
TEST(HybridCollectives, EachGroupCarriesItsOwnCollectives) {
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec spec;
        auto mesh = make_device_mesh(pg, 2);
        auto model = build_model(spec);
        const int64_t shard_bytes = expected_shard_bytes(model, mesh.shards(), mesh.shard_index());
        auto root = shard_model(model, mesh, spec);
        const int64_t units = static_cast<int64_t>(model->layers.size()) + 1;
        auto [tokens, targets] = global_batch(spec, 0);
        const int64_t local = spec.batch / 4;
        auto step = [&] {
          loss_of(root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
                  spec.model.output_size())
              .backward();
        };
        for (auto* g : {&mesh.world, &mesh.shard, &mesh.replicate}) (*g)->reset_stats();

        root.set_requires_gradient_sync(false);
        step();
        EXPECT_EQ(mesh.shard->stats().count(CollectiveKind::kReduceScatter), 0);
        EXPECT_EQ(mesh.replicate->stats().count(CollectiveKind::kAllReduce), 0);
        root.set_requires_gradient_sync(true);
        mesh.shard->reset_stats();
        step();

        const auto& shard = mesh.shard->stats();
        const auto& rep = mesh.replicate->stats();
        EXPECT_EQ(shard.count(CollectiveKind::kReduceScatter), units);
        EXPECT_GE(shard.count(CollectiveKind::kAllGather), units);
        EXPECT_EQ(shard.count(CollectiveKind::kAllReduce), 0);
        EXPECT_EQ(rep.count(CollectiveKind::kAllReduce), units);
        EXPECT_EQ(rep.count(CollectiveKind::kAllGather), 0);
        EXPECT_EQ(rep.count(CollectiveKind::kReduceScatter), 0);
        EXPECT_EQ(rep.bytes_of(CollectiveKind::kAllReduce) * mesh.shards(),
                  shard.bytes_of(CollectiveKind::kReduceScatter));
        for (int k = 0; k < kNumCollectiveKinds; ++k) EXPECT_EQ(mesh.world->stats().calls[k], 0);
        // Memory: every rank holds 1/shards of the parameters, as plain FSDP over 2 ranks.
        EXPECT_EQ(root.memory_stats().sharded_param_bytes, shard_bytes);
      },
      test_options());
}

// The norm over the shard group (the mesh form) and the model form, which reads the groups from
// the units, both count each gradient shard once: the plain FSDP norm.
TEST(HybridClip, NormIsThePlainFsdpNorm) {
  TrainSpec spec;
  double plain_norm = 0;
  auto backward_once = [&](Unit<TinyLM>& root, const ProcessGroupPtr& world) {
    auto [tokens, targets] = global_batch(spec, 0);
    const int64_t local = spec.batch / world->size();
    loss_of(root(rank_slice(tokens, world, local)), rank_slice(targets, world, local),
            spec.model.output_size())
        .backward();
  };
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        auto root = shard_model(model, pg, spec);
        backward_once(root, pg);
        double n = total_grad_norm(root.parameters(), pg);
        if (pg->rank() == 0) plain_norm = n;
      },
      test_options());
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, 2);
        auto model = build_model(spec);
        auto root = shard_model(model, mesh, spec);
        backward_once(root, pg);
        EXPECT_NEAR(total_grad_norm(root), plain_norm, 1e-6 * plain_norm);
        const double n = clip_grad_norm_(root.parameters(), 1e9, mesh);
        EXPECT_NEAR(n, plain_norm, 1e-6 * plain_norm);
      },
      test_options());
}

std::string fresh_dir(const std::string& name) {
  auto dir = "/tmp/fsdp_hsdp_" + name + "_" + std::to_string(::getpid());
  EXPECT_EQ(std::system(("rm -rf '" + dir + "'").c_str()), 0);
  return dir;
}

// Saved under 2x2, loaded under plain FSDP at 4 and 3 ranks and under 4x1: the same full
// parameters; only replica 0 writes rows, so the checkpoint is as large as a plain one.
TEST(HybridCheckpoint, SavesEachShardOnceAndLoadsUnderAnyLayout) {
  TrainSpec spec;
  const std::string dir = fresh_dir("ckpt");
  std::vector<std::pair<std::string, at::Tensor>> saved;
  std::string path;
  // One AdamW step on `replicas` replicas at world 4, saved into `into`; returns the path.
  auto train_and_save = [&](int replicas, const std::string& into) {
    std::string out;
    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& pg) {
          auto mesh = make_device_mesh(pg, replicas);
          auto model = build_model(spec);
          std::vector<int64_t> dim0;
          for (const auto& p : model->parameters()) dim0.push_back(p.size(0));
          auto root = shard_model(model, mesh, spec);
          torch::optim::AdamW opt(root.parameters(), torch::optim::AdamWOptions(spec.lr));
          auto [tokens, targets] = global_batch(spec, 0);
          loss_of(root(rank_slice(tokens, pg, 3)), rank_slice(targets, pg, 3),
                  spec.model.output_size())
              .backward();
          opt.step();
          auto p = save_checkpoint(into, 1, *model, &opt, pg);
          if (pg->rank() == 0) out = p;
          if (replicas == 1) return;
          size_t i = 0;
          for (const auto& item : model->named_parameters()) {
            auto full = gather_full(mesh.shard, item.value(), dim0[i++]);  // collective
            if (pg->rank() == 0) saved.emplace_back(item.key(), full);
          }
        },
        test_options());
    return out;
  };
  path = train_and_save(2, dir);
  // The same model saved plainly at world 4: the hybrid checkpoint's rank files hold as many
  // bytes (replica 1 wrote no rows).
  const std::string plain_dir = fresh_dir("plain");
  const std::string plain_path = train_and_save(1, plain_dir);
  auto bytes_of_rank_files = [](const std::string& step_dir) {
    int64_t total = 0;
    for (int r = 0; r < 4; ++r) {
      struct stat st {};
      const auto f = step_dir + "/rank_0000" + std::to_string(r) + ".bin";
      if (::stat(f.c_str(), &st) == 0) total += st.st_size;
    }
    return total;
  };
  EXPECT_EQ(bytes_of_rank_files(path), bytes_of_rank_files(plain_path));
  EXPECT_GT(bytes_of_rank_files(path), 0);
  for (int replicas_then : {1, 4}) {
    for (int world : {4, 3}) {
      if (replicas_then == 4 && world == 3) continue;
      run_local_ranks(
          world,
          [&](const ProcessGroupPtr& pg) {
            auto mesh = make_device_mesh(pg, replicas_then == 4 ? world : 1);
            TrainSpec other = spec;
            other.seed = 99;  // different initial values, all overwritten by the load
            auto model = build_model(other);
            std::vector<int64_t> dim0;
            for (const auto& p : model->parameters()) dim0.push_back(p.size(0));
            auto root = shard_model(model, mesh, spec);
            torch::optim::AdamW opt(root.parameters(), torch::optim::AdamWOptions(spec.lr));
            load_checkpoint(path, *model, &opt, pg);
            size_t i = 0;
            for (const auto& item : model->named_parameters()) {
              auto full = gather_full(mesh.shard, item.value(), dim0[i]);
              if (pg->rank() == 0) {
                EXPECT_TRUE(at::equal(full, saved[i].second))
                    << item.key() << " at world " << world << ", " << mesh.replicas()
                    << " replicas";
              }
              ++i;
            }
          },
          test_options());
    }
  }
  // Exported under 2x2: the same file as the gathered parameters.
  std::string file = dir + "/model.safetensors";
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto mesh = make_device_mesh(pg, 2);
        auto model = build_model(spec);
        auto root = shard_model(model, mesh, spec);
        load_checkpoint(path, *model, nullptr, pg);
        export_safetensors(file, *model, pg);
      },
      test_options());
  std::map<std::string, at::Tensor> exported;
  for (auto& [name, t] : read_safetensors(file)) exported[name] = t;
  for (const auto& [name, want] : saved) {
    ASSERT_TRUE(exported.count(name)) << name;
    EXPECT_TRUE(at::equal(exported.at(name), want)) << name;
  }
  EXPECT_EQ(std::system(("rm -rf '" + dir + "' '" + plain_dir + "'").c_str()), 0);
}

TEST(HybridErrors, LayoutsThatDoNotFitTheWorldAreNamed) {
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        expect_error_containing<InvalidArgument>(
            [&] { make_device_mesh(pg, 3); },
            "3 replicas do not divide a world of 4 ranks; expected one of 1, 2, 4");
        expect_error_containing<InvalidArgument>([&] { make_device_mesh(pg, 0); },
                                                 "0 replicas do not divide");
        // Groups of different sizes: rank 0 alone, ranks 1-3 together.
        auto shard = pg->split(pg->rank() == 0 ? 0 : 1);
        expect_error_containing<InvalidArgument>(
            [&] { make_device_mesh(pg, shard, nullptr); },
            "rank 1 has a shard group of 3 ranks and 1 replicas, rank 0 has 1 and 1");
        // The same sizes everywhere but not multiplying to the world.
        auto pairs = pg->split(pg->rank() / 2);
        expect_error_containing<InvalidArgument>([&] { make_device_mesh(pg, pairs, nullptr); },
                                                 "2 shards x 1 replicas is 2 ranks, but the "
                                                 "world has 4");
        // A hand-made mesh of the right shape works like make_device_mesh's.
        auto replicate = pg->split(pg->rank() % 2);
        auto mesh = make_device_mesh(pg, pairs, replicate);
        EXPECT_EQ(mesh.replicas(), 2);
        EXPECT_TRUE(mesh.hybrid());
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
