// The bound every teardown waits under (src/util/poll.h, the NCCL group's destructor): a stuck
// stream, faked by a condition that never comes true, ends the wait at the timeout instead of
// holding the process; one that drains ends it at once; no timeout waits without a bound.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "util/poll.h"

namespace fsdp::testing {
namespace {

using std::chrono::milliseconds;

TEST(BoundedWait, AStuckStreamEndsAtTheTimeout) {
  int polls = 0;
  const bool drained = detail::wait_until(
      [&] {
        ++polls;
        return false;  // the fake stream never drains
      },
      milliseconds(30));
  EXPECT_FALSE(drained);
  EXPECT_GT(polls, 1);  // it kept looking until the bound
}

TEST(BoundedWait, ADrainingStreamEndsAtOnce) {
  int polls = 0;
  EXPECT_TRUE(detail::wait_until([&] { return ++polls == 3; }, milliseconds(60000)));
  EXPECT_EQ(polls, 3);
}

TEST(BoundedWait, NoTimeoutWaitsForTheCondition) {
  std::atomic<bool> done{false};
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(20));
    done = true;
  });
  EXPECT_TRUE(detail::wait_until([&] { return done.load(); }, milliseconds(0)));
  later.join();
}

}  // namespace
}  // namespace fsdp::testing
