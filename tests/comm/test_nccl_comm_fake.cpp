// NcclComm's protocol against a fake NCCL (fake_nccl.h), on any machine: the non-blocking split
// settles the parent before it reads the child (the first GPU run crashed on the reverse), a
// failed split leaves the parent usable or aborted with its cause, never a stack slot written
// late; an abort in progress blocks no other caller; a rank leaving on an error aborts instead of
// finalising; the device guard creates no context.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/nccl/nccl_comm.h"
#include "fake_nccl.h"
#include "fsdp/errors.h"

namespace fsdp::testing {
namespace {

using detail::NcclComm;
namespace fake = fake_nccl;

class FakeNccl : public ::testing::Test {
 protected:
  void SetUp() override { fake::reset(); }
  std::shared_ptr<NcclComm> parent(std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    ncclUniqueId id{};
    return NcclComm::init(/*rank=*/1, /*world=*/4, /*device=*/0, id, timeout);
  }
  // One call through the communicator, as a collective's launch makes.
  static void launch(NcclComm& c) {
    c.run("all_reduce", [](ncclComm_t) { return ncclSuccess; });
  }
};

TEST_F(FakeNccl, SplitSettlesTheParentBeforeItReadsTheChild) {
  auto p = parent();
  auto child = p->split(/*color=*/1, /*key=*/1, /*child_world=*/2);
  ASSERT_NE(child, nullptr);
  EXPECT_EQ(child->rank(), 1);
  EXPECT_EQ(child->world(), 2);
  EXPECT_FALSE(child->aborted());
  EXPECT_FALSE(p->aborted());
  EXPECT_NO_THROW(launch(*p));
  EXPECT_NO_THROW(launch(*child));
  EXPECT_NO_THROW(p->check("wait"));
  EXPECT_FALSE(fake::stats().split_slot_on_stack) << "NCCL writes the child's handle late";
  EXPECT_EQ(fake::stats().aborts, 0);
}

TEST_F(FakeNccl, ARefusedSplitLeavesTheParentUsable) {
  auto p = parent();
  fake::set_next_split(fake::Split::kRefused);
  try {
    p->split(1, 1, 2);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "split");
    EXPECT_NE(e.cause().find("invalid argument"), std::string::npos) << e.what();
    EXPECT_NE(e.cause().find("parent communicator is unchanged"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(p->aborted());
  EXPECT_NO_THROW(launch(*p));
}

TEST_F(FakeNccl, AFailedParentJobAbortsBothWithItsCause) {
  auto p = parent();
  fake::set_next_split(fake::Split::kParentFails);
  try {
    p->split(1, 1, 2);
    FAIL() << "expected a CommError";
  } catch (const TimeoutError& e) {
    FAIL() << "not a timeout: " << e.what();
  } catch (const CommError& e) {
    EXPECT_EQ(e.op(), "split");
    EXPECT_NE(e.cause().find("unhandled system error"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(p->aborted());
  EXPECT_EQ(fake::stats().aborts, 2) << "the parent and the child NCCL wrote";
  EXPECT_FALSE(fake::stats().split_slot_on_stack);
  // Later calls name the cause instead of reaching the aborted communicator.
  try {
    launch(*p);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(e.cause().find("unhandled system error"), std::string::npos) << e.what();
  }
}

TEST_F(FakeNccl, APeerMissingTheSplitIsATimeoutAndTheParentIsAborted) {
  auto p = parent(std::chrono::milliseconds(200));
  fake::set_next_split(fake::Split::kParentHangs);
  EXPECT_THROW(p->split(1, 1, 2), TimeoutError);
  EXPECT_TRUE(p->aborted());
  EXPECT_FALSE(fake::stats().split_slot_on_stack) << "the job may still write the slot";
  EXPECT_THROW(p->check("wait"), CommError);
}

TEST_F(FakeNccl, AChildThatFailsItsInitIsAbortedAndTheParentStaysUsable) {
  auto p = parent();
  fake::set_next_split(fake::Split::kChildFails);
  try {
    p->split(1, 1, 2);
    FAIL() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_NE(e.cause().find("internal error"), std::string::npos) << e.what();
    EXPECT_NE(e.cause().find("the parent is usable"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(p->aborted());
  EXPECT_EQ(fake::stats().aborts, 1) << "the child alone";
  EXPECT_NO_THROW(launch(*p));
}

// The watchdog aborts from its own thread: while ncclCommAbort runs (it joins NCCL's threads,
// seconds on a real machine), a wait or a launch elsewhere throws the cause instead of queueing
// behind the communicator's lock.
TEST_F(FakeNccl, AnAbortInProgressBlocksNoOtherCaller) {
  auto p = parent();
  fake::hold_aborts(true);
  std::thread watchdog([&] { p->abort("the peer died"); });
  while (!fake::abort_in_progress()) std::this_thread::yield();
  auto waiter = std::async(std::launch::async, [&] {
    try {
      p->check("wait");
      return std::string("(no error)");
    } catch (const CommError& e) {
      return e.cause();
    }
  });
  // A generous bound that only a wait queued behind the abort reaches (a hang guard, not a
  // timing): the abort is held until the waiter is done.
  const bool done = waiter.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  fake::release_abort();
  watchdog.join();
  ASSERT_TRUE(done) << "a wait queued behind the abort";
  EXPECT_EQ(waiter.get(), "the peer died");
  EXPECT_EQ(fake::stats().aborts, 1);
}

// A rank leaving on an error must not wait in ncclCommFinalize for its peers (they may wait in a
// collective it will never issue): destroyed while an exception propagates, the communicator is
// aborted; destroyed otherwise, it is finalised.
TEST_F(FakeNccl, LeavingOnAnErrorAbortsInsteadOfFinalising) {
  { auto p = parent(); }
  EXPECT_EQ(fake::stats().finalizes, 1);
  EXPECT_EQ(fake::stats().aborts, 0);
  try {
    auto p = parent();
    throw std::runtime_error("this rank's step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(fake::stats().finalizes, 1) << "finalised on the way out of an error";
  EXPECT_EQ(fake::stats().aborts, 1);
}

// ncclCommAbort can wait for peers that do not abort too: a rank leaving on an error waits for
// it only so long, then goes on (the abort continues on its own thread), the communicator
// marked aborted with the cause.
TEST_F(FakeNccl, LeavingOnAnErrorWaitsForTheAbortOnlySoLong) {
  auto p = parent();
  fake::hold_aborts(true);
  EXPECT_FALSE(p->abort_leaving("leaving on an error",
                                std::chrono::steady_clock::now() + std::chrono::milliseconds(50)));
  EXPECT_TRUE(p->aborted());
  try {
    launch(*p);
    FAIL() << "a launch on an aborted communicator";
  } catch (const CommError& e) {
    EXPECT_EQ(e.cause(), "leaving on an error");
  }
  fake::release_abort();
  // The detached abort returns once released (a hang guard, not a timing).
  for (int i = 0; i < 30000 && fake::stats().aborts == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(fake::stats().aborts, 1);
  fake::hold_aborts(false);
  EXPECT_TRUE(p->abort_leaving("again", std::chrono::steady_clock::now())) << "already aborted";
  EXPECT_EQ(fake::stats().aborts, 1);
}

TEST_F(FakeNccl, TheDeviceGuardSetsNothingWhenTheDeviceIsCurrent) {
  std::thread([] {
    { detail::CudaDeviceGuard guard(0); }
    EXPECT_EQ(fake::stats().set_device_calls, 0);
  }).join();
}

TEST_F(FakeNccl, TheDeviceGuardCreatesNoContextOnTheWayOut) {
  // A thread that never chose a device reads device 0, which has no context in this process.
  fake::set_primary_context(0, false);
  std::thread([] {
    { detail::CudaDeviceGuard guard(3); }
    EXPECT_EQ(fake::stats().set_device_calls, 1) << "device 3 set, device 0 not put back";
    EXPECT_FALSE(detail::cuda_primary_context_exists(0));
  }).join();
  // Where device 0 is in use, it is put back.
  fake::set_primary_context(0, true);
  std::thread([] {
    { detail::CudaDeviceGuard guard(3); }
    EXPECT_EQ(fake::stats().set_device_calls, 3);
    int device = -1;
    cudaGetDevice(&device);
    EXPECT_EQ(device, 0);
  }).join();
}

}  // namespace
}  // namespace fsdp::testing
