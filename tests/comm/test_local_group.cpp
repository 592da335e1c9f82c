// The thread-rank ("local") group: the shared collective bodies at world sizes 1 to 4, plus
// its own failure modes (a rank that never arrives, ranks that disagree).
#include <gtest/gtest.h>

#include "comm/collective_cases.h"
#include "fsdp/comm/local_group.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {

class LocalGroupTest : public ::testing::TestWithParam<int> {};

TEST_P(LocalGroupTest, EveryCollective) {
  run_local_ranks(GetParam(), [](const ProcessGroupPtr& pg) {
    EXPECT_EQ(pg->backend_name(), "local");
    testing::check_every_collective(*pg);
  });
}

TEST_P(LocalGroupTest, Bf16AccumulatesInFp32) {
  run_local_ranks(GetParam(),
                  [](const ProcessGroupPtr& pg) { testing::check_bf16_accumulates_in_fp32(*pg); });
}

TEST_P(LocalGroupTest, AsyncOpsCompleteInOrder) {
  run_local_ranks(GetParam(),
                  [](const ProcessGroupPtr& pg) { testing::check_async_in_order(*pg); });
}

TEST_P(LocalGroupTest, SplitByParity) {
  run_local_ranks(GetParam(), [](const ProcessGroupPtr& pg) { testing::check_split(*pg); });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, LocalGroupTest, ::testing::Values(1, 2, 3, 4));

TEST(LocalGroup, MissingPeerTimesOutInsteadOfHanging) {
  LocalGroupOptions options;
  options.timeout = std::chrono::milliseconds(200);
  auto groups = make_local_groups(2, options);
  // Rank 1 never calls: rank 0 must fail with a TimeoutError naming the op.
  auto t = at::ones({4});
  try {
    groups[0]->all_reduce(t, ReduceOp::kSum)->wait();
    FAIL() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_EQ(e.op(), "all_reduce");
    EXPECT_EQ(e.rank(), 0);
    EXPECT_EQ(e.world_size(), 2);
  }
  // The world is now broken: the next collective fails at once instead of waiting again.
  EXPECT_THROW(groups[0]->barrier()->wait(), CommError);
}

TEST(LocalGroup, MismatchedCollectivesFailOnEveryRank) {
  std::atomic<int> failures{0};
  run_local_ranks(2, [&](const ProcessGroupPtr& pg) {
    auto t = at::ones({pg->rank() == 0 ? 4 : 5});  // ranks disagree on numel
    try {
      pg->all_reduce(t, ReduceOp::kSum)->wait();
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("numel"), std::string::npos) << e.what();
      ++failures;
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

TEST(LocalGroup, RunLocalRanksRethrowsARankError) {
  EXPECT_THROW(run_local_ranks(3,
                               [](const ProcessGroupPtr& pg) {
                                 if (pg->rank() == 2) throw InvalidArgument("rank 2 failed");
                               }),
               InvalidArgument);
}

TEST(LocalGroup, CountsCollectivesAndBytes) {
  run_local_ranks(2, [](const ProcessGroupPtr& pg) {
    auto in = at::ones({3});
    auto out = at::empty({6});
    pg->all_gather(out, in)->wait();
    pg->all_gather(out, in)->wait();
    pg->reduce_scatter(in, out, ReduceOp::kAvg)->wait();
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 2);
    EXPECT_EQ(pg->stats().bytes_of(CollectiveKind::kAllGather), 2 * 3 * 4);
    EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), 1);
    EXPECT_EQ(pg->stats().bytes_of(CollectiveKind::kReduceScatter), 6 * 4);
    pg->reset_stats();
    EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 0);
  });
}

}  // namespace
}  // namespace fsdp
