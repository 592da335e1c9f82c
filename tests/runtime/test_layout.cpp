// torch.chunk's rule: ceil(d0 / N) rows per rank, trailing ranks fewer or none.
#include <gtest/gtest.h>

#include "fsdp/errors.h"
#include "fsdp/runtime/layout.h"

namespace fsdp {
namespace {

TEST(ShardRange, Divisible) {
  auto r = shard_range(8, 4, 2);
  EXPECT_EQ(r.rows_per_rank, 2);
  EXPECT_EQ(r.begin, 4);
  EXPECT_EQ(r.end, 6);
}

TEST(ShardRange, NotDivisible) {
  // 10 rows over 4 ranks: 3, 3, 3, 1.
  int64_t rows[4];
  for (int r = 0; r < 4; ++r) rows[r] = shard_range(10, 4, r).rows();
  EXPECT_EQ(rows[0], 3);
  EXPECT_EQ(rows[2], 3);
  EXPECT_EQ(rows[3], 1);
}

TEST(ShardRange, FewerRowsThanRanks) {
  // 3 rows over 4 ranks: 1, 1, 1, 0. And 5 over 4 (ceil 2): 2, 2, 1, 0.
  EXPECT_EQ(shard_range(3, 4, 2).rows(), 1);
  EXPECT_EQ(shard_range(3, 4, 3).rows(), 0);
  EXPECT_EQ(shard_range(5, 4, 2).rows(), 1);
  EXPECT_EQ(shard_range(5, 4, 3).rows(), 0);
  EXPECT_EQ(shard_range(5, 4, 3).begin, 5);
}

TEST(ShardRange, CoversEveryRowOnce) {
  for (int64_t d0 : {0, 1, 2, 7, 60, 1001}) {
    for (int world = 1; world <= 8; ++world) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        auto s = shard_range(d0, world, r);
        EXPECT_EQ(s.begin, next) << d0 << " " << world << " " << r;
        EXPECT_LE(s.rows(), s.rows_per_rank);
        next = s.end;
      }
      EXPECT_EQ(next, d0);
    }
  }
}

TEST(ShardRange, RejectsBadArguments) {
  EXPECT_THROW(shard_range(4, 0, 0), InvalidArgument);
  EXPECT_THROW(shard_range(4, 2, 2), InvalidArgument);
  EXPECT_THROW(shard_range(-1, 2, 0), InvalidArgument);
}

}  // namespace
}  // namespace fsdp
