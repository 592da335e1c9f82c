// The MPI backend for real: run by ctest under `mpiexec -n K` (K = 1..4); every rank runs the
// same tests. Launched through init_from_env, as a user's program would be.
#include <gtest/gtest.h>

#include "comm/collective_cases.h"
#include "fsdp/fsdp.h"
#include "support/multi_process_main.h"

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
  int rc = fsdp::testing::run_tests_on_every_rank(*d.group);
  fsdp::world().reset();
  d.group.reset();
  return rc;
}
