// Which engine and device a launch uses: pure rules, no communication (init_from_env.cpp acts
// on them).
#include <fmt/format.h>

#include <cstdlib>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"

namespace fsdp {
namespace {

const char* getenv_or_null(const EnvLookup& getenv, const char* name) {
  const char* v = getenv ? getenv(name) : std::getenv(name);
  return (v && *v) ? v : nullptr;
}

bool is_cpu_engine(Backend b) {
  return b == Backend::kMpi || b == Backend::kGloo || b == Backend::kLocal;
}

// The rank's GPU: cuda:LOCAL_RANK, one rank per GPU; or cuda:0 when the process was given one
// GPU of its own (Slurm's --gpus-per-task=1, a Kubernetes device plugin: exactly one visible,
// selected by CUDA_VISIBLE_DEVICES or NVIDIA_VISIBLE_DEVICES), whatever its LOCAL_RANK is.
c10::Device rank_gpu(const LaunchInfo& launch, int gpus, const std::string& why,
                     const EnvLookup& getenv) {
  if (gpus <= 0) {
    throw LaunchError(fmt::format("{}, but libtorch sees no CUDA device", why));
  }
  // Only a variable naming one device: containers set NVIDIA_VISIBLE_DEVICES=all everywhere, and
  // several ranks on a machine of one GPU must still be refused here, not by NCCL later.
  auto names_one = [&](const char* var) {
    const char* v = getenv_or_null(getenv, var);
    if (!v) return false;
    const std::string s(v);
    return !s.empty() && s.find(',') == std::string::npos && s != "all" && s != "none" &&
           s != "void";
  };
  const bool own_gpu =
      gpus == 1 && (names_one("CUDA_VISIBLE_DEVICES") || names_one("NVIDIA_VISIBLE_DEVICES"));
  if (own_gpu) return c10::Device(c10::kCUDA, 0);
  if (launch.local_rank >= gpus) {
    throw LaunchError(fmt::format(
        "local rank {} has no GPU: this node has {} visible (one rank per GPU; start at most {} "
        "ranks per node, give each process its own GPU with CUDA_VISIBLE_DEVICES, or run on the "
        "CPU with FSDP_BACKEND=gloo|mpi or FSDP_DEVICE=cpu)",
        launch.local_rank, gpus, gpus));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
}

// FSDP_REQUIRE_GPU=1 (the GPU check sets it): a run that would fall back to the CPU fails
// instead, naming why, so that a machine whose libtorch cannot reach its GPU is not measured as
// a CPU run.
void check_gpu_required(const EngineChoice& choice, int gpus, const EnvLookup& getenv) {
  const char* v = getenv_or_null(getenv, "FSDP_REQUIRE_GPU");
  if (!v || std::string(v) == "0" || choice.device.is_cuda()) return;
  const std::string why =
      gpus <= 0 ? "libtorch sees no CUDA device (a CPU-only libtorch, libtorch_cuda not loaded "
                  "by the program, or a driver older than the wheel needs)"
                : fmt::format("backend '{}' runs on the CPU (FSDP_BACKEND or FSDP_DEVICE chose it)",
                              backend_name(choice.backend));
  throw LaunchError(fmt::format("FSDP_REQUIRE_GPU={} but this run would use the CPU: {}", v, why));
}

Backend auto_backend(const LaunchInfo& launch, const c10::Device& device) {
  if (device.is_cuda()) return Backend::kNccl;
  switch (launch.launcher) {
    case Launcher::kMpirun:
      return Backend::kMpi;
    case Launcher::kSingle:
      return Backend::kLocal;
    default:
      // torchrun-style variables meet over TCP; Slurm without MASTER_ADDR: srun provides MPI.
      return launch.master_addr.empty() ? Backend::kMpi : Backend::kGloo;
  }
}

}  // namespace

const char* device_choice_name(DeviceChoice choice) {
  switch (choice) {
    case DeviceChoice::kAuto:
      return "auto";
    case DeviceChoice::kCpu:
      return "cpu";
    case DeviceChoice::kCuda:
      return "cuda";
  }
  return "unknown";
}

DeviceChoice parse_device_choice(const std::string& name) {
  for (auto c : {DeviceChoice::kAuto, DeviceChoice::kCpu, DeviceChoice::kCuda}) {
    if (name == device_choice_name(c)) return c;
  }
  throw LaunchError(fmt::format("device '{}' is not one of auto, cpu, cuda", name));
}

std::optional<Backend> parse_backend_choice(const std::string& name) {
  if (name == "auto") return std::nullopt;
  for (auto b : {Backend::kMpi, Backend::kGloo, Backend::kNccl, Backend::kLocal}) {
    if (name == backend_name(b)) return b;
  }
  if (name == backend_name(Backend::kFake)) {
    throw LaunchError(
        "backend 'fake' plays one rank without communicating, for tests (make_fake_group); a "
        "launch needs one of auto, mpi, gloo, nccl, local");
  }
  throw LaunchError(fmt::format("backend '{}' is not one of auto, mpi, gloo, nccl, local", name));
}

EngineChoice choose_engine(const LaunchInfo& launch, const InitOptions& options, int visible_gpus,
                           const EnvLookup& getenv) {
  std::optional<Backend> backend = options.backend;
  if (!backend) {
    if (const char* v = getenv_or_null(getenv, "FSDP_BACKEND")) {
      try {
        backend = parse_backend_choice(v);
      } catch (const LaunchError& e) {
        throw LaunchError(fmt::format("FSDP_BACKEND={}: {}", v, e.what()));
      }
    }
  }
  DeviceChoice device = options.device;
  if (device == DeviceChoice::kAuto) {
    if (const char* v = getenv_or_null(getenv, "FSDP_DEVICE")) {
      try {
        device = parse_device_choice(v);
      } catch (const LaunchError& e) {
        throw LaunchError(fmt::format("FSDP_DEVICE={}: {}", v, e.what()));
      }
    }
  }

  EngineChoice out;
  if (backend && is_cpu_engine(*backend)) {
    // A CPU engine forced on a GPU machine runs on the CPU: a GPU in the machine must never make
    // a CPU run fail.
    if (device == DeviceChoice::kCuda) {
      throw LaunchError(
          fmt::format("backend '{}' works on CPU tensors; use device 'cpu' or backend 'nccl'",
                      backend_name(*backend)));
    }
    out.device = c10::Device(c10::kCPU);
  } else if (backend == Backend::kNccl) {
    if (device == DeviceChoice::kCpu) {
      throw LaunchError("backend 'nccl' needs a CUDA device, and this process runs on cpu");
    }
    out.device = rank_gpu(launch, visible_gpus, "backend 'nccl' needs a CUDA device", getenv);
  } else if (backend) {
    throw LaunchError(fmt::format("backend '{}' cannot be launched", backend_name(*backend)));
  } else if (device == DeviceChoice::kCpu || (device == DeviceChoice::kAuto && visible_gpus <= 0)) {
    out.device = c10::Device(c10::kCPU);
  } else {
    out.device = rank_gpu(launch, visible_gpus, "device 'cuda' was requested", getenv);
  }
  out.backend = backend ? *backend : auto_backend(launch, out.device);
  if (out.backend == Backend::kLocal && launch.world_size != 1) {
    throw LaunchError(
        fmt::format("backend 'local' in init_from_env is a single process, but the launcher says "
                    "WORLD_SIZE={}",
                    launch.world_size));
  }
  check_gpu_required(out, visible_gpus, getenv);
  return out;
}

}  // namespace fsdp
