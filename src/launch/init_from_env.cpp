#include <ATen/Context.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"
#include "fsdp/comm/local_group.h"

namespace fsdp {
namespace {

c10::Device choose_device(const InitOptions& options, const LaunchInfo& launch) {
  bool gpu = at::hasCUDA() && at::getNumGPUs() > 0;
  if (options.device == "cpu" || (options.device == "auto" && !gpu)) return c10::Device(c10::kCPU);
  if (options.device != "cuda" && options.device != "auto") {
    throw LaunchError(fmt::format("device '{}' is not one of auto, cpu, cuda", options.device));
  }
  if (!gpu) {
    throw LaunchError("device 'cuda' was requested but libtorch sees no CUDA device");
  }
  int gpus = static_cast<int>(at::getNumGPUs());
  if (launch.local_rank >= gpus) {
    throw LaunchError(
        fmt::format("local rank {} has no GPU: this node has {} visible (one rank "
                    "per GPU; start at most {} ranks per node)",
                    launch.local_rank, gpus, gpus));
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(launch.local_rank));
}

std::string choose_backend(const InitOptions& options, const LaunchInfo& launch,
                           const c10::Device& device) {
  std::string backend = options.backend;
  if (backend == "auto") {
    if (const char* forced = std::getenv("FSDP_BACKEND")) backend = forced;
  }
  if (backend == "auto") {
    if (device.is_cuda()) return "nccl";
    if (launch.launcher == "mpirun") return "mpi";
    if (launch.launcher == "single") return "local";
    if (!launch.master_addr.empty()) return "gloo";
    return "mpi";  // Slurm without MASTER_ADDR: srun provides MPI
  }
  if (backend != "mpi" && backend != "gloo" && backend != "nccl" && backend != "local") {
    throw LaunchError(
        fmt::format("backend '{}' is not one of auto, mpi, gloo, nccl, local", backend));
  }
  if (backend == "nccl" && !device.is_cuda()) {
    throw LaunchError("backend 'nccl' needs a CUDA device, and this process runs on cpu");
  }
  if (backend != "nccl" && device.is_cuda()) {
    throw LaunchError(
        fmt::format("backend '{}' works on CPU tensors; use device 'cpu' or "
                    "backend 'nccl'",
                    backend));
  }
  if (backend == "local" && launch.world_size != 1) {
    throw LaunchError(
        fmt::format("backend 'local' in init_from_env is a single process, but "
                    "the launcher says WORLD_SIZE={}",
                    launch.world_size));
  }
  return backend;
}

c10::intrusive_ptr<c10d::Store> connect_store(const LaunchInfo& launch,
                                              std::chrono::milliseconds timeout) {
  if (launch.master_addr.empty()) {
    throw LaunchError(
        fmt::format("a TCP rendezvous is needed for this backend under {}, but "
                    "MASTER_ADDR and MASTER_PORT are not set",
                    launch.launcher));
  }
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(launch.master_port);
  opts.isServer = !launch.use_agent_store && launch.rank == 0;
  opts.numWorkers =
      launch.use_agent_store ? c10::nullopt : c10::optional<std::size_t>(launch.world_size);
  opts.waitWorkers = false;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(launch.master_addr, opts);
  } catch (const std::exception& e) {
    throw CommError("tcp_store", "connect", launch.rank, launch.world_size,
                    fmt::format("{}:{}: {}", launch.master_addr, launch.master_port, e.what()));
  }
  if (launch.use_agent_store) {
    // torchrun's own convention for worker keys inside the agent's store.
    store = c10::make_intrusive<c10d::PrefixStore>(
        fmt::format("/worker/attempt_{}", launch.restart_count), store);
  }
  return c10::make_intrusive<c10d::PrefixStore>("fsdp", store);
}

std::vector<uint8_t> exchange_nccl_id(const LaunchInfo& launch, std::chrono::milliseconds timeout) {
  if (launch.world_size == 1) return make_nccl_unique_id();
  if (launch.master_addr.empty() && has_mpi_backend()) {
    // Under mpirun: rank 0's id travels over MPI.
    auto mpi = make_mpi_world_group(timeout);
    auto id = at::zeros({128}, at::kByte);
    if (launch.rank == 0) {
      auto bytes = make_nccl_unique_id();
      id = at::from_blob(bytes.data(), {static_cast<int64_t>(bytes.size())}, at::kByte).clone();
    }
    mpi->broadcast(id, 0)->wait();
    return std::vector<uint8_t>(id.data_ptr<uint8_t>(), id.data_ptr<uint8_t>() + id.numel());
  }
  auto store = connect_store(launch, timeout);
  const std::string key = "nccl_unique_id";
  if (launch.rank == 0) store->set(key, make_nccl_unique_id());
  return store->get(key);
}

}  // namespace

Distributed init_from_env(const InitOptions& options) {
  return init_from_launch(detect_launch(), options);
}

Distributed init_from_launch(const LaunchInfo& launch, const InitOptions& options) {
  Distributed d;
  d.launch = launch;
  d.device = choose_device(options, d.launch);
  auto backend = choose_backend(options, d.launch, d.device);
  if (backend == "local") {
    d.group = make_local_groups(1).front();
  } else if (backend == "mpi") {
    d.group = make_mpi_world_group(options.timeout);
    if (d.launch.launcher != "single" &&
        (d.group->rank() != d.launch.rank || d.group->size() != d.launch.world_size)) {
      throw LaunchError(fmt::format(
          "MPI reports rank {} of {} but the {} environment says {} of "
          "{}",
          d.group->rank(), d.group->size(), d.launch.launcher, d.launch.rank, d.launch.world_size));
    }
    d.launch.rank = d.group->rank();
    d.launch.world_size = d.group->size();
  } else if (backend == "gloo") {
    d.group = make_gloo_group(connect_store(d.launch, options.timeout), d.launch.rank,
                              d.launch.world_size, options.timeout);
  } else {
    auto id = exchange_nccl_id(d.launch, options.timeout);
    d.group =
        make_nccl_group(d.launch.rank, d.launch.world_size, d.device.index(), id, options.timeout);
  }
  return d;
}

}  // namespace fsdp
