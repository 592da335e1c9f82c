// Launch detection from environment variables: each launcher, and each malformed variable
// raising a LaunchError that names it.
#include <gtest/gtest.h>

#include <map>

#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"

namespace fsdp {
namespace {

LaunchInfo detect(const std::map<std::string, std::string>& vars) {
  return detect_launch([&](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
}

void expect_launch_error(const std::map<std::string, std::string>& vars,
                         const std::string& needle) {
  try {
    detect(vars);
    FAIL() << "expected LaunchError containing '" << needle << "'";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(DetectLaunch, SingleProcessWhenNothingIsSet) {
  auto info = detect({});
  EXPECT_EQ(info.launcher, Launcher::kSingle);
  EXPECT_EQ(info.world_size, 1);
  EXPECT_EQ(info.rank, 0);
}

TEST(DetectLaunch, Torchrun) {
  auto info = detect({{"RANK", "3"},
                      {"WORLD_SIZE", "4"},
                      {"LOCAL_RANK", "1"},
                      {"MASTER_ADDR", "10.0.0.1"},
                      {"MASTER_PORT", "29500"},
                      {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                      {"TORCHELASTIC_RESTART_COUNT", "2"}});
  EXPECT_EQ(info.launcher, Launcher::kTorchrun);
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_TRUE(info.use_agent_store);
  EXPECT_EQ(info.restart_count, 2);
}

TEST(DetectLaunch, OpenMpiAndPmiAndSlurm) {
  auto ompi = detect({{"OMPI_COMM_WORLD_RANK", "1"},
                      {"OMPI_COMM_WORLD_SIZE", "2"},
                      {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}});
  EXPECT_EQ(ompi.launcher, Launcher::kMpirun);
  EXPECT_EQ(ompi.rank, 1);
  EXPECT_EQ(ompi.world_size, 2);
  auto pmi = detect({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}});
  EXPECT_EQ(pmi.launcher, Launcher::kMpirun);
  EXPECT_EQ(pmi.rank, 2);
  EXPECT_EQ(pmi.local_rank, 2);
  auto slurm = detect({{"SLURM_PROCID", "5"},
                       {"SLURM_NTASKS", "8"},
                       {"SLURM_LOCALID", "1"},
                       {"MASTER_ADDR", "node0"},
                       {"MASTER_PORT", "1234"}});
  EXPECT_EQ(slurm.launcher, Launcher::kSlurm);
  EXPECT_EQ(slurm.rank, 5);
  EXPECT_EQ(slurm.local_rank, 1);
  EXPECT_EQ(slurm.master_addr, "node0");
}

TEST(DetectLaunch, MalformedVariablesAreNamed) {
  expect_launch_error({{"RANK", "abc"}, {"WORLD_SIZE", "2"}}, "RANK='abc' is not an integer");
  expect_launch_error(
      {{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}},
      "RANK=2 is out of range");
  expect_launch_error({{"RANK", "0"}}, "WORLD_SIZE is not set");
  expect_launch_error({{"RANK", "0"}, {"WORLD_SIZE", "0"}}, "WORLD_SIZE=0 is out of range");
  expect_launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}}, "MASTER_ADDR is not set");
  expect_launch_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}},
                      "MASTER_PORT is not set");
  expect_launch_error(
      {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}},
      "MASTER_PORT=70000 is out of range");
  expect_launch_error({{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "x1"}},
                      "OMPI_COMM_WORLD_RANK='x1' is not an integer");
}

TEST(InitFromEnv, RejectsImpossibleChoices) {
  InitOptions options;
  options.backend = Backend::kFake;
  EXPECT_THROW(init_from_env(options), LaunchError);
  options.backend = Backend::kNccl;
  options.device = DeviceChoice::kCpu;
  EXPECT_THROW(init_from_env(options), LaunchError);
}

TEST(InitFromEnv, SingleProcessGetsAWorldOfOne) {
  InitOptions options;
  options.device = DeviceChoice::kCpu;  // the same on a machine with a GPU
  auto d = init_from_env(options);
  EXPECT_EQ(d.launch.launcher, Launcher::kSingle);
  EXPECT_EQ(d.group->size(), 1);
  auto t = at::ones({3});
  d.group->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(t, at::ones({3})));
}

}  // namespace
}  // namespace fsdp
