#include <ATen/Context.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <fmt/format.h>

#include <atomic>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "fsdp/comm/backends.h"
#include "fsdp/comm/local_group.h"
#include "fsdp/errors.h"
#include "fsdp/launch/launch.h"
#include "fsdp/launch/rendezvous.h"

namespace fsdp {
namespace {

int visible_gpus() { return at::hasCUDA() ? static_cast<int>(at::getNumGPUs()) : 0; }

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
  // A key per group this process starts: torchrun's agent store outlives one init, and a value
  // left by an earlier one must not be read as this one's. Every rank starts groups in the
  // same order.
  static std::atomic<int> started{0};
  const std::string key = fmt::format("nccl_unique_id/{}", started++);
  auto store = connect_store(launch, timeout);
  // Rank 0 returns only once every rank has read the id: only then may its store (the server,
  // unless torchrun's agent hosts it) go away with this scope.
  return share_over_store(*store, key, launch.rank, launch.world_size,
                          launch.rank == 0 ? make_nccl_unique_id() : std::vector<uint8_t>{},
                          timeout);
}

}  // namespace

Distributed init_from_env(const InitOptions& options) {
  return init_from_launch(detect_launch(), options);
}

Distributed init_from_launch(const LaunchInfo& launch, const InitOptions& options) {
  Distributed d;
  d.launch = launch;
  const EngineChoice engine = choose_engine(launch, options, visible_gpus());
  d.device = engine.device;
  if (d.device.is_cuda()) {
    // Once per rank: the rank's GPU becomes the current device, so that allocations and kernels
    // the program (or libtorch) makes without naming an index land there, not on GPU 0. Through
    // c10's device guard interface, which libtorch_cuda registers: no CUDA headers needed.
    c10::impl::getDeviceGuardImpl(c10::kCUDA)->setDevice(d.device);
  }
  switch (engine.backend) {
    case Backend::kLocal:
      d.group = make_local_groups(1).front();
      break;
    case Backend::kMpi:
      d.group = make_mpi_world_group(options.timeout);
      if (d.launch.launcher != Launcher::kSingle &&
          (d.group->rank() != d.launch.rank || d.group->size() != d.launch.world_size)) {
        throw LaunchError(fmt::format(
            "MPI reports rank {} of {} but the {} environment says {} of {}", d.group->rank(),
            d.group->size(), launcher_name(d.launch.launcher), d.launch.rank, d.launch.world_size));
      }
      d.launch.rank = d.group->rank();
      d.launch.world_size = d.group->size();
      break;
    case Backend::kGloo:
      d.group = make_gloo_group(connect_store(d.launch, options.timeout), d.launch.rank,
                                d.launch.world_size, options.timeout);
      break;
    case Backend::kNccl: {
      auto id = exchange_nccl_id(d.launch, options.timeout);
      d.group = make_nccl_group(d.launch.rank, d.launch.world_size, d.device.index(), id,
                                options.timeout);
      break;
    }
    case Backend::kFake:
      throw LaunchError("backend 'fake' cannot be launched");  // choose_engine refuses it first
  }
  return d;
}

}  // namespace fsdp
