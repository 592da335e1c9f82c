// Start-up from the launcher's environment: one call that finds rank and world size, picks the
// device and the engine, and returns a ready process group.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "fsdp/comm/process_group.h"

namespace fsdp {

// How this process was started.
enum class Launcher {
  kSingle,    // none of the variables below: one process, world size 1
  kTorchrun,  // RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun, scripts/launch.sh)
  kMpirun,    // Open MPI's OMPI_COMM_WORLD_*, or PMI_RANK/PMI_SIZE
  kSlurm,     // SLURM_PROCID/SLURM_NTASKS
};
// "single", "torchrun", "mpirun", "slurm".
const char* launcher_name(Launcher launcher);

// What the environment says about how this process was started.
struct LaunchInfo {
  Launcher launcher = Launcher::kSingle;
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

// Which kind of device a process computes on; kAuto lets init_from_env decide.
enum class DeviceChoice { kAuto, kCpu, kCuda };
// "auto", "cpu", "cuda".
const char* device_choice_name(DeviceChoice choice);

// For flags and environment variables. Both throw LaunchError naming the value and the choices.
// "auto", "cpu", "cuda".
DeviceChoice parse_device_choice(const std::string& name);
// "auto" -> nullopt (chosen from the device and the launcher); "mpi", "gloo", "nccl", "local".
// "fake" is refused: the fake group is for tests (make_fake_group), not a launch.
std::optional<Backend> parse_backend_choice(const std::string& name);

// InitOptions::backend: a std::optional<Backend> (nullopt: auto) that also takes 0.1.0's names.
// The constructors are implicit, as the optional's are.
class BackendOption : public std::optional<Backend> {
 public:
  BackendOption() = default;
  using std::optional<Backend>::optional;
  BackendOption(const std::optional<Backend>& backend) : std::optional<Backend>(backend) {}
  // Deprecated (since 0.2.0): 0.1.0's string, as parse_backend_choice reads it ("auto": nullopt).
  // A name it refuses throws its LaunchError here (0.1.0 threw it from init_from_env).
  [[deprecated("assign a fsdp::Backend, or std::nullopt for auto")]] BackendOption(
      const std::string& name)
      : std::optional<Backend>(parse_backend_choice(name)) {}
  [[deprecated("assign a fsdp::Backend, or std::nullopt for auto")]] BackendOption(const char* name)
      : std::optional<Backend>(parse_backend_choice(name)) {}
  BackendOption(std::nullptr_t) = delete;
};

// InitOptions::device: a DeviceChoice that also takes 0.1.0's names. The constructors and the
// conversion are implicit, so that it reads and assigns as the enum does.
class DeviceOption {
 public:
  DeviceOption(DeviceChoice choice = DeviceChoice::kAuto) : choice_(choice) {}
  // Deprecated (since 0.2.0): 0.1.0's string, as parse_device_choice reads it. A name it refuses
  // throws its LaunchError here (0.1.0 threw it from init_from_env).
  [[deprecated("assign a fsdp::DeviceChoice")]] DeviceOption(const std::string& name)
      : choice_(parse_device_choice(name)) {}
  [[deprecated("assign a fsdp::DeviceChoice")]] DeviceOption(const char* name)
      : choice_(parse_device_choice(name)) {}
  DeviceOption(std::nullptr_t) = delete;

  operator DeviceChoice() const { return choice_; }

 private:
  DeviceChoice choice_;
};

struct InitOptions {
  // The engine. nullopt (auto): the FSDP_BACKEND environment variable when set; else NCCL when
  // the device is CUDA, MPI under mpirun, Gloo under a torchrun-style launch, the in-process
  // "local" group for a single process.
  BackendOption backend;
  // The device. kAuto: the FSDP_DEVICE environment variable when set; else the CPU when the
  // engine is a CPU one (MPI, Gloo, local: forcing FSDP_BACKEND=gloo on a GPU machine runs on
  // the CPU), else cuda:LOCAL_RANK when libtorch sees a GPU, else the CPU.
  DeviceOption device = DeviceChoice::kAuto;
  // How long a collective or the rendezvous waits for peers before failing with CommError:
  // Gloo, MPI (which then aborts the job: make_mpi_world_group), NCCL (its watchdog and its
  // initialisation), the TCP store. A dead, stuck or diverged peer ends the run in about this
  // time instead of hanging it.
  std::chrono::milliseconds timeout{std::chrono::seconds(60)};
};

// The engine and device init_from_launch uses, decided without starting anything.
struct EngineChoice {
  Backend backend = Backend::kLocal;
  c10::Device device{c10::kCPU};
};

// The rules of InitOptions, from `launch`, the number of GPUs libtorch sees and the variables
// FSDP_BACKEND and FSDP_DEVICE (read through `getenv`, std::getenv by default; an option that
// is not auto wins over its variable). A rank computes on cuda:LOCAL_RANK, or on cuda:0 when
// it sees exactly one GPU selected for it (CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES set:
// Slurm's --gpus-per-task=1, Kubernetes). Throws LaunchError for an impossible choice: NCCL
// without a GPU or on the CPU, a CPU engine on CUDA, a local rank without its GPU, the "local"
// engine in a launch of several processes, a malformed variable; and, with FSDP_REQUIRE_GPU=1,
// any choice of the CPU (naming why: no CUDA device visible to libtorch, or a CPU engine).
EngineChoice choose_engine(const LaunchInfo& launch, const InitOptions& options, int visible_gpus,
                           const EnvLookup& getenv = nullptr);

struct Distributed {
  LaunchInfo launch;
  c10::Device device{c10::kCPU};
  ProcessGroupPtr group;
};

// detect_launch() + choose_engine() + backend construction. On CUDA the rank's GPU becomes the
// current device of the calling thread (once, here), so that work the program queues without
// naming a device index lands on it. Throws LaunchError for a bad environment or an impossible
// choice, CommError when the engine fails to start.
// Ending on an error: let an error that leaves training propagate out of the scope that holds
// the Distributed (catch it in main, around that scope). Its groups, destroyed while the
// exception propagates, then do not wait for the other ranks (see make_mpi_world_group and
// make_nccl_group), and the launcher ends the job as this process exits. Caught while the
// groups live, the error leaves their ordinary teardown to wait for the others' timeout.
Distributed init_from_env(const InitOptions& options = {});

// The same from a LaunchInfo the program already has (detect_launch() called once, say to
// validate flags before any communication).
Distributed init_from_launch(const LaunchInfo& launch, const InitOptions& options = {});

// Deprecated (since 0.2.0): 0.1.0's LaunchInfo::launcher, InitOptions::backend and
// InitOptions::device were strings; these compare the new values with such a string by name
// (launcher_name, backend_name or "auto", device_choice_name), so `info.launcher == "torchrun"`
// keeps its meaning. An unknown name compares unequal.
[[deprecated("compare with a fsdp::Launcher")]] inline bool operator==(Launcher launcher,
                                                                       const std::string& name) {
  return name == launcher_name(launcher);
}
[[deprecated("compare with a fsdp::Launcher")]] inline bool operator==(const std::string& name,
                                                                       Launcher launcher) {
  return name == launcher_name(launcher);
}
[[deprecated("compare with a fsdp::Launcher")]] inline bool operator!=(Launcher launcher,
                                                                       const std::string& name) {
  return name != launcher_name(launcher);
}
[[deprecated("compare with a fsdp::Launcher")]] inline bool operator!=(const std::string& name,
                                                                       Launcher launcher) {
  return name != launcher_name(launcher);
}

[[deprecated("compare with a fsdp::Backend, or std::nullopt for auto")]] inline bool operator==(
    const BackendOption& backend, const std::string& name) {
  return name == (backend ? backend_name(*backend) : "auto");
}
[[deprecated("compare with a fsdp::Backend, or std::nullopt for auto")]] inline bool operator==(
    const std::string& name, const BackendOption& backend) {
  return name == (backend ? backend_name(*backend) : "auto");
}
[[deprecated("compare with a fsdp::Backend, or std::nullopt for auto")]] inline bool operator!=(
    const BackendOption& backend, const std::string& name) {
  return name != (backend ? backend_name(*backend) : "auto");
}
[[deprecated("compare with a fsdp::Backend, or std::nullopt for auto")]] inline bool operator!=(
    const std::string& name, const BackendOption& backend) {
  return name != (backend ? backend_name(*backend) : "auto");
}

[[deprecated("compare with a fsdp::DeviceChoice")]] inline bool operator==(
    const DeviceOption& device, const std::string& name) {
  return name == device_choice_name(device);
}
[[deprecated("compare with a fsdp::DeviceChoice")]] inline bool operator==(
    const std::string& name, const DeviceOption& device) {
  return name == device_choice_name(device);
}
[[deprecated("compare with a fsdp::DeviceChoice")]] inline bool operator!=(
    const DeviceOption& device, const std::string& name) {
  return name != device_choice_name(device);
}
[[deprecated("compare with a fsdp::DeviceChoice")]] inline bool operator!=(
    const std::string& name, const DeviceOption& device) {
  return name != device_choice_name(device);
}

}  // namespace fsdp
