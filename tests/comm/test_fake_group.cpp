// The fake group plays one rank of a large world without communicating: right sizes and counts,
// and the numbers of a world in which every rank holds the same data.
#include <gtest/gtest.h>

#include "fsdp/comm/fake_group.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {

TEST(FakeGroup, PlaysRankOfLargeWorld) {
  auto pg = make_fake_group(/*rank=*/3, /*world_size=*/8);
  EXPECT_EQ(pg->rank(), 3);
  EXPECT_EQ(pg->size(), 8);
  EXPECT_EQ(pg->backend_name(), "fake");

  auto in = at::arange(5, at::kFloat);
  auto out = at::empty({40});
  pg->all_gather(out, in)->wait();
  EXPECT_TRUE(at::equal(out, in.repeat({8})));

  auto full = at::arange(40, at::kFloat);
  auto shard = at::empty({5});
  pg->reduce_scatter(shard, full, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(shard, full.narrow(0, 15, 5) * 8));
  pg->reduce_scatter(shard, full, ReduceOp::kAvg)->wait();
  EXPECT_TRUE(at::equal(shard, full.narrow(0, 15, 5)));

  auto t = at::ones({4});
  pg->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(t, at::full({4}, 8.0)));

  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 1);
  EXPECT_EQ(pg->stats().count(CollectiveKind::kReduceScatter), 2);
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllReduce), 1);
  EXPECT_EQ(pg->stats().bytes_of(CollectiveKind::kReduceScatter), 2 * 40 * 4);
}

TEST(FakeGroup, ChecksArgumentsLikeARealGroup) {
  auto pg = make_fake_group(0, 4);
  EXPECT_THROW(pg->all_gather(at::empty({7}), at::empty({2})), InvalidArgument);
}

TEST(FakeGroup, SplitKeepsTheSimulatedWorld) {
  auto pg = make_fake_group(5, 8);
  auto sub = pg->split(1);
  EXPECT_EQ(sub->size(), 8);
  EXPECT_EQ(sub->rank(), 5);
}

}  // namespace
}  // namespace fsdp
