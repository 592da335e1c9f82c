// The MPI backend for real: run by ctest under `mpiexec -n K` (K = 1..4); every rank runs the
// same tests. Launched through init_from_env, as a user's program would be.
#include <gtest/gtest.h>

#include "comm/collective_cases.h"
#include "fsdp/fsdp.h"

namespace fsdp {
namespace {

ProcessGroupPtr& world() {
  static ProcessGroupPtr pg;
  return pg;
}

TEST(MpiGroup, LaunchedByMpirun) { EXPECT_EQ(world()->backend_name(), "mpi"); }

TEST(MpiGroup, EveryCollective) { testing::check_every_collective(*world()); }
TEST(MpiGroup, Bf16AccumulatesInFp32) { testing::check_bf16_accumulates_in_fp32(*world()); }
TEST(MpiGroup, AsyncOpsCompleteInOrder) { testing::check_async_in_order(*world()); }
TEST(MpiGroup, SplitByParity) { testing::check_split(*world()); }

}  // namespace
}  // namespace fsdp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto d = fsdp::init_from_env();
  fsdp::world() = d.group;
  // Only rank 0 prints test progress; every rank still reports failures through its exit code.
  if (d.group->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  // Combine results: any failing rank fails the run on every rank.
  auto failed = at::full({1}, rc != 0 ? 1 : 0, at::kInt);
  d.group->all_reduce(failed, fsdp::ReduceOp::kSum)->wait();
  fsdp::world().reset();
  d.group.reset();
  return failed.item<int>() != 0 ? 1 : 0;
}
