// A torchrun-style launch on CPU: ctest starts it through scripts/launch.sh --nproc K, which sets
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT; init_from_env must pick Gloo over a TCP store.
#include <gtest/gtest.h>

#include "comm/collective_cases.h"
#include "fsdp/fsdp.h"
#include "support/multi_process_main.h"

namespace fsdp {
namespace {

Distributed& dist() {
  static Distributed d;
  return d;
}

TEST(EnvLaunch, PicksGlooOverTcp) {
  EXPECT_EQ(dist().launch.launcher, Launcher::kTorchrun);
  EXPECT_EQ(dist().group->backend_name(), "gloo");
  EXPECT_EQ(dist().group->size(), dist().launch.world_size);
  EXPECT_EQ(dist().group->rank(), dist().launch.rank);
}

TEST(EnvLaunch, EveryCollective) { testing::check_every_collective(*dist().group); }
TEST(EnvLaunch, Bf16AccumulatesInFp32) { testing::check_bf16_accumulates_in_fp32(*dist().group); }
TEST(EnvLaunch, SplitByParity) { testing::check_split(*dist().group); }

}  // namespace
}  // namespace fsdp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  fsdp::dist() = fsdp::init_from_env();
  auto& pg = fsdp::dist().group;
  int rc = fsdp::testing::run_tests_on_every_rank(*pg);
  pg.reset();
  return rc;
}
