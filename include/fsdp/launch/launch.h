// Start-up from the launcher's environment: one call that finds rank and world size, picks the
// device and the engine, and returns a ready process group.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp {

// What the environment says about how this process was started.
struct LaunchInfo {
  // "torchrun" (RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, also scripts/launch.sh), "mpirun"
  // (Open MPI's OMPI_COMM_WORLD_* or PMI_RANK/PMI_SIZE), "slurm" (SLURM_PROCID/SLURM_NTASKS),
  // or "single" (none of these: one process, world size 1).
  std::string launcher = "single";
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // TCP rendezvous; empty/0 when the launcher needs none (mpirun, single).
  std::string master_addr;
  int master_port = 0;
  // torchrun's agent already runs the store (TORCHELASTIC_USE_AGENT_STORE=True): every rank
  // connects as a client, under the key prefix "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>".
  bool use_agent_store = false;
  int restart_count = 0;
};

// Reads the launch variables through `getenv` (std::getenv by default). Throws LaunchError
// naming the variable, its value and what was expected when one is malformed or missing.
using EnvLookup = std::function<const char*(const char*)>;
LaunchInfo detect_launch(const EnvLookup& getenv = nullptr);

struct InitOptions {
  // "auto": NCCL when CUDA is usable, else MPI under mpirun, Gloo under torchrun-style launch,
  // the in-process "local" group for a single process. Or force "mpi", "gloo", "nccl".
  // The FSDP_BACKEND environment variable, when set, overrides "auto".
  std::string backend = "auto";
  // "auto": cuda:LOCAL_RANK when libtorch sees a GPU, else cpu. Or "cpu" / "cuda".
  std::string device = "auto";
  // How long a collective or the rendezvous waits for peers before failing with CommError:
  // Gloo, MPI (which then aborts the job: make_mpi_world_group), the TCP store. A dead,
  // stuck or diverged peer ends the run in about this time instead of hanging it.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

struct Distributed {
  LaunchInfo launch;
  c10::Device device{c10::kCPU};
  ProcessGroupPtr group;
};

// detect_launch() + device choice + backend construction. Throws LaunchError for a bad
// environment or an impossible choice (say backend "nccl" without a GPU), CommError when the
// engine fails to start.
Distributed init_from_env(const InitOptions& options = {});

// The same from a LaunchInfo the program already has (detect_launch() called once, say to
// validate flags before any communication).
Distributed init_from_launch(const LaunchInfo& launch, const InitOptions& options = {});

}  // namespace fsdp
