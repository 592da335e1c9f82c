// The engine and device a launch picks (choose_engine), for machines with and without GPUs:
// pure rules, so every case runs here, none needs a GPU.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"

namespace fsdp {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup lookup(const Vars& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

LaunchInfo torchrun(int rank, int world, int local_rank) {
  LaunchInfo l;
  l.launcher = Launcher::kTorchrun;
  l.rank = rank;
  l.world_size = world;
  l.local_rank = local_rank;
  l.master_addr = "127.0.0.1";
  l.master_port = 29500;
  return l;
}

LaunchInfo mpirun(int rank, int world) {
  LaunchInfo l;
  l.launcher = Launcher::kMpirun;
  l.rank = l.local_rank = rank;
  l.world_size = world;
  return l;
}

EngineChoice choose(const LaunchInfo& l, int gpus, const Vars& vars = {},
                    InitOptions options = {}) {
  return choose_engine(l, options, gpus, lookup(vars));
}

void expect_error(const LaunchInfo& l, int gpus, const Vars& vars, InitOptions options,
                  const std::string& needle) {
  try {
    choose(l, gpus, vars, options);
    FAIL() << "expected LaunchError containing '" << needle << "'";
  } catch (const LaunchError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(EngineChoice, AutoPicksEachRanksGpu) {
  // Item 1 of issue 24: rank 1 of two on a two-GPU node computes on cuda:1, not cuda:0.
  auto e = choose(torchrun(1, 2, 1), /*gpus=*/2);
  EXPECT_EQ(e.backend, Backend::kNccl);
  EXPECT_EQ(e.device, c10::Device(c10::kCUDA, 1));
  e = choose(torchrun(5, 8, 1), /*gpus=*/4);  // second node: the local rank names the GPU
  EXPECT_EQ(e.device, c10::Device(c10::kCUDA, 1));
}

TEST(EngineChoice, AutoWithoutGpuFollowsTheLauncher) {
  EXPECT_EQ(choose(torchrun(0, 2, 0), 0).backend, Backend::kGloo);
  EXPECT_EQ(choose(mpirun(1, 2), 0).backend, Backend::kMpi);
  EXPECT_EQ(choose(LaunchInfo{}, 0).backend, Backend::kLocal);
  EXPECT_EQ(choose(torchrun(0, 2, 0), 0).device, c10::Device(c10::kCPU));
  LaunchInfo slurm = mpirun(0, 2);
  slurm.launcher = Launcher::kSlurm;
  EXPECT_EQ(choose(slurm, 0).backend, Backend::kMpi);  // no MASTER_ADDR: srun brings MPI
}

TEST(EngineChoice, ForcedCpuEngineRunsOnCpuWhereGpusExist) {
  // Item 4: FSDP_BACKEND=gloo on a GPU machine used to pick CUDA, then refuse gloo; and rank 1
  // of a launch on a one-GPU machine failed with "local rank 1 has no GPU".
  for (int gpus : {1, 8}) {
    auto gloo = choose(torchrun(1, 2, 1), gpus, {{"FSDP_BACKEND", "gloo"}});
    EXPECT_EQ(gloo.backend, Backend::kGloo);
    EXPECT_EQ(gloo.device, c10::Device(c10::kCPU));
    auto mpi = choose(mpirun(1, 2), gpus, {{"FSDP_BACKEND", "mpi"}});
    EXPECT_EQ(mpi.backend, Backend::kMpi);
    EXPECT_EQ(mpi.device, c10::Device(c10::kCPU));
    auto local = choose(LaunchInfo{}, gpus, {{"FSDP_BACKEND", "local"}});
    EXPECT_EQ(local.backend, Backend::kLocal);
    EXPECT_EQ(local.device, c10::Device(c10::kCPU));
    InitOptions forced;
    forced.backend = Backend::kGloo;
    EXPECT_EQ(choose(torchrun(0, 2, 0), gpus, {}, forced).device, c10::Device(c10::kCPU));
  }
}

TEST(EngineChoice, DeviceVariableForcesTheCpu) {
  auto e = choose(torchrun(1, 2, 1), /*gpus=*/1, {{"FSDP_DEVICE", "cpu"}});
  EXPECT_EQ(e.backend, Backend::kGloo);
  EXPECT_EQ(e.device, c10::Device(c10::kCPU));
  EXPECT_EQ(choose(LaunchInfo{}, 1, {{"FSDP_DEVICE", "cpu"}}).backend, Backend::kLocal);
  EXPECT_EQ(choose(LaunchInfo{}, 1).backend, Backend::kNccl);  // the variable unset
}

TEST(EngineChoice, OptionsWinOverVariables) {
  InitOptions o;
  o.backend = Backend::kMpi;
  o.device = DeviceChoice::kCpu;
  auto e = choose(mpirun(0, 2), 2, {{"FSDP_BACKEND", "nccl"}, {"FSDP_DEVICE", "cuda"}}, o);
  EXPECT_EQ(e.backend, Backend::kMpi);
  EXPECT_EQ(e.device, c10::Device(c10::kCPU));
}

TEST(EngineChoice, ImpossibleChoicesAreNamed) {
  InitOptions cuda;
  cuda.device = DeviceChoice::kCuda;
  expect_error(torchrun(0, 2, 0), 1, {{"FSDP_BACKEND", "gloo"}}, cuda,
               "backend 'gloo' works on CPU tensors");
  expect_error(torchrun(0, 2, 0), 0, {{"FSDP_BACKEND", "nccl"}}, {},
               "backend 'nccl' needs a CUDA device, but libtorch sees no CUDA device");
  expect_error(torchrun(0, 2, 0), 2, {{"FSDP_BACKEND", "nccl"}, {"FSDP_DEVICE", "cpu"}}, {},
               "backend 'nccl' needs a CUDA device, and this process runs on cpu");
  expect_error(torchrun(1, 2, 1), 1, {}, {}, "local rank 1 has no GPU");
  expect_error(LaunchInfo{}, 0, {}, cuda, "device 'cuda' was requested");
  expect_error(torchrun(0, 2, 0), 0, {{"FSDP_BACKEND", "local"}}, {},
               "backend 'local' in init_from_env is a single process");
  expect_error(LaunchInfo{}, 0, {{"FSDP_BACKEND", "carrier-pigeon"}}, {},
               "FSDP_BACKEND=carrier-pigeon: backend 'carrier-pigeon' is not one of");
  expect_error(LaunchInfo{}, 0, {{"FSDP_DEVICE", "tpu"}}, {}, "FSDP_DEVICE=tpu");
  InitOptions fake;
  fake.backend = Backend::kFake;
  expect_error(LaunchInfo{}, 0, {}, fake, "cannot be launched");
}

TEST(EngineChoice, NamesParseBack) {
  for (auto b : {Backend::kMpi, Backend::kGloo, Backend::kNccl, Backend::kLocal}) {
    EXPECT_EQ(parse_backend_choice(backend_name(b)), b);
  }
  EXPECT_EQ(parse_backend_choice("auto"), std::nullopt);
  EXPECT_THROW(parse_backend_choice("fake"), LaunchError);
  EXPECT_THROW(parse_backend_choice("NCCL"), LaunchError);
  for (auto d : {DeviceChoice::kAuto, DeviceChoice::kCpu, DeviceChoice::kCuda}) {
    EXPECT_EQ(parse_device_choice(device_choice_name(d)), d);
  }
  EXPECT_THROW(parse_device_choice("gpu"), LaunchError);
  EXPECT_STREQ(launcher_name(Launcher::kTorchrun), "torchrun");
  EXPECT_STREQ(launcher_name(Launcher::kSingle), "single");
}

// One GPU per process (Slurm's --gpus-per-task=1, Kubernetes): every rank sees exactly one,
// selected for it, and computes on cuda:0 whatever its LOCAL_RANK. Without the selection a
// second local rank on a one-GPU machine is still a mistake, named.
TEST(EngineChoice, OneGpuPerProcessIsCudaZero) {
  for (const char* var : {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}) {
    for (int local_rank : {0, 1, 3}) {
      auto e = choose(torchrun(local_rank, 4, local_rank), /*gpus=*/1, {{var, "2"}});
      EXPECT_EQ(e.backend, Backend::kNccl);
      EXPECT_EQ(e.device, c10::Device(c10::kCUDA, 0)) << var << " local rank " << local_rank;
    }
  }
  // Two visible: the selection does not change which of them the rank takes.
  EXPECT_EQ(choose(torchrun(1, 2, 1), 2, {{"CUDA_VISIBLE_DEVICES", "4,5"}}).device,
            c10::Device(c10::kCUDA, 1));
  expect_error(torchrun(1, 2, 1), 1, {}, {}, "give each process its own GPU with");
  // A container's blanket setting names no one device: two ranks on one GPU are still refused.
  expect_error(torchrun(1, 2, 1), 1, {{"NVIDIA_VISIBLE_DEVICES", "all"}}, {},
               "local rank 1 has no GPU");
  expect_error(torchrun(1, 2, 1), 1, {{"CUDA_VISIBLE_DEVICES", "0,1"}}, {},
               "local rank 1 has no GPU");
}

// FSDP_REQUIRE_GPU=1: a run that would fall back to the CPU fails, naming why.
TEST(EngineChoice, RequiredGpuRefusesTheCpu) {
  const Vars require{{"FSDP_REQUIRE_GPU", "1"}};
  EXPECT_EQ(choose(torchrun(1, 2, 1), 2, require).device, c10::Device(c10::kCUDA, 1));
  expect_error(torchrun(0, 2, 0), 0, require, {},
               "FSDP_REQUIRE_GPU=1 but this run would use the "
               "CPU: libtorch sees no CUDA device");
  expect_error(LaunchInfo{}, 0, require, {}, "libtorch_cuda not loaded");
  Vars gloo = require;
  gloo["FSDP_BACKEND"] = "gloo";
  expect_error(torchrun(0, 2, 0), 2, gloo, {}, "backend 'gloo' runs on the CPU");
  // Off (unset or 0): the CPU as before.
  EXPECT_EQ(choose(LaunchInfo{}, 0, {{"FSDP_REQUIRE_GPU", "0"}}).device, c10::Device(c10::kCPU));
}

}  // namespace
}  // namespace fsdp
