// Desync detection (ProcessGroup::set_desync_check, FSDP_DEBUG_DESYNC=1) on thread ranks: ranks
// that issue different collectives all raise the same CommError naming the first divergent
// collective and which ranks issued what; ranks that agree see no change (results, counts); and
// an FSDP model whose forward skips a unit on one rank is caught at its first differing gather.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>

#include "fsdp/fsdp.h"
#include "support/torch_api.h"

namespace fsdp {
namespace {

LocalGroupOptions short_timeout() {
  LocalGroupOptions o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

// Runs body on `world` thread ranks with the check on; returns each rank's CommError text
// (empty when the rank finished without one).
std::vector<std::string> desync_messages(int world,
                                         const std::function<void(const ProcessGroupPtr&)>& body) {
  std::vector<std::string> messages(world);
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        pg->set_desync_check(true);
        try {
          body(pg);
        } catch (const CommError& e) {
          messages[pg->rank()] = e.what();
        }
      },
      short_timeout());
  return messages;
}

TEST(Desync, AgreeingRanksSeeTheSameResultsAndCounts) {
  run_local_ranks(3, [](const ProcessGroupPtr& pg) {
    pg->set_desync_check(true);
    auto in = at::full({4}, static_cast<float>(pg->rank()));
    auto out = at::empty({12});
    pg->all_gather(out, in)->wait();
    auto sum = at::ones({5});
    pg->all_reduce(sum, ReduceOp::kSum)->wait();
    pg->barrier()->wait();
    EXPECT_TRUE(at::equal(out, at::arange(3).repeat_interleave(4).to(at::kFloat)));
    EXPECT_TRUE(at::equal(sum, at::full({5}, 3.0f)));
    // The fingerprint exchanges are not counted as the caller's collectives.
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 1);
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllReduce), 1);
    EXPECT_EQ(pg->stats().count(CollectiveKind::kBarrier), 1);
  });
}

TEST(Desync, DifferentOperationsFailOnEveryRankNamingThem) {
  auto messages = desync_messages(3, [](const ProcessGroupPtr& pg) {
    auto t = at::ones({6});
    pg->all_reduce(t, ReduceOp::kSum)->wait();  // collective #0: all agree
    if (pg->rank() == 1) {
      pg->reduce_scatter(at::empty({2}), t, ReduceOp::kAvg)->wait();
    } else {
      pg->all_gather(at::empty({18}), t)->wait();
    }
  });
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE(messages[r]);
    EXPECT_NE(messages[r].find("desynchronised collectives"), std::string::npos);
    EXPECT_NE(messages[r].find("collective #1"), std::string::npos);
    EXPECT_NE(messages[r].find("ranks 0,2 issued collective #1: all_gather of 6 Float elements"),
              std::string::npos);
    EXPECT_NE(messages[r].find("rank 1 issued collective #1: reduce_scatter of 6 Float elements "
                               "(avg)"),
              std::string::npos);
  }
  // The same text on every rank, after each rank's own prefix.
  EXPECT_EQ(messages[0].substr(messages[0].find("desync")),
            messages[1].substr(messages[1].find("desync")));
}

TEST(Desync, DifferentSizesAndDtypesAreNamed) {
  auto messages = desync_messages(2, [](const ProcessGroupPtr& pg) {
    auto t = pg->rank() == 0 ? at::ones({8}) : at::ones({8}, at::kDouble);
    pg->all_reduce(t, ReduceOp::kSum)->wait();
  });
  for (const auto& m : messages) {
    EXPECT_NE(m.find("rank 0 issued collective #0: all_reduce of 8 Float elements (sum)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 1 issued collective #0: all_reduce of 8 Double elements (sum)"),
              std::string::npos)
        << m;
  }
}

TEST(Desync, EnvironmentVariableTurnsItOn) {
  ::setenv("FSDP_DEBUG_DESYNC", "1", 1);
  auto on = make_local_groups(2);
  ::setenv("FSDP_DEBUG_DESYNC", "0", 1);
  auto off = make_local_groups(2);
  ::unsetenv("FSDP_DEBUG_DESYNC");
  EXPECT_TRUE(on[0]->desync_check());
  EXPECT_FALSE(off[0]->desync_check());
}

// Three units of different sizes under a root: rank 1 skips the middle one.
struct ThreeImpl : torch::nn::Module {
  ThreeImpl() {
    a = register_module("a", torch::nn::Linear(8, 8));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(8, 8).bias(false)));
    c = register_module("c", torch::nn::Linear(torch::nn::LinearOptions(8, 4)));
    head = register_module("head", torch::nn::Linear(4, 2));
  }
  at::Tensor forward(at::Tensor x, bool skip_b) {
    x = a(x);
    if (!skip_b) x = b(x);
    return head(c(x));
  }
  Unit<torch::nn::Linear> a{nullptr}, b{nullptr}, c{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Three);

std::string run_three(const ProcessGroupPtr& pg, int skipping_rank, int64_t batch_of_rank1) {
  pg->set_desync_check(true);
  torch::manual_seed(0);
  Three model;
  fully_shard(model->a, pg);
  fully_shard(model->b, pg);
  fully_shard(model->c, pg);
  auto root = fully_shard(model, pg);
  try {
    for (int step = 0; step < 2; ++step) {
      const int64_t batch = pg->rank() == 1 ? batch_of_rank1 : 4;
      auto x = torch::randn({batch, 8});
      root(x, pg->rank() == skipping_rank).sum().backward();
    }
  } catch (const CommError& e) {
    return e.what();
  }
  return "";
}

TEST(Desync, ARankSkippingAUnitsForwardIsCaughtOnEveryRank) {
  std::vector<std::string> messages(3);
  run_local_ranks(
      3, [&](const ProcessGroupPtr& pg) { messages[pg->rank()] = run_three(pg, 1, 4); },
      short_timeout());
  for (const auto& m : messages) {
    // Ranks 0 and 2 gather b (3 of its 8 rows per rank: 24 elements), rank 1 already c (2 of
    // its 4 rows and their biases: 18).
    EXPECT_NE(m.find("desynchronised collectives"), std::string::npos) << m;
    EXPECT_NE(m.find("ranks 0,2 issued collective #2: all_gather of 24 Float elements"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("rank 1 issued collective #2: all_gather of 18 Float elements"),
              std::string::npos)
        << m;
  }
}

TEST(Desync, AnotherBatchShapeIsNotADesync) {
  // FSDP's collectives move parameters and gradients, whose shapes do not depend on the batch:
  // a rank with another batch size issues the same collectives, and the check stays silent.
  std::vector<std::string> messages(2);
  run_local_ranks(
      2, [&](const ProcessGroupPtr& pg) { messages[pg->rank()] = run_three(pg, -1, 7); },
      short_timeout());
  EXPECT_EQ(messages[0], "");
  EXPECT_EQ(messages[1], "");
}

}  // namespace
}  // namespace fsdp
