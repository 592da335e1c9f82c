#include "fsdp/comm/device_mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>
#include <vector>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

}  // namespace

DeviceMesh make_device_mesh(const ProcessGroupPtr& world, int replicas) {
  FSDP_CHECK_ARG(world != nullptr, "make_device_mesh: the world group is null");
  const int n = world->size();
  FSDP_CHECK_ARG(replicas >= 1 && replicas <= n && n % replicas == 0,
                 "make_device_mesh: {} replicas do not divide a world of {} ranks; expected one "
                 "of {}",
                 replicas, n, fmt::join(divisors(n), ", "));
  if (replicas == 1) return flat_mesh(world);
  const int shards = n / replicas;
  DeviceMesh mesh;
  mesh.world = world;
  // Row-major (replicas, shards): consecutive ranks share a replica, so a shard group stays on
  // one machine when the launcher numbers a machine's ranks consecutively.
  mesh.shard = world->split(world->rank() / shards);
  mesh.replicate = world->split(world->rank() % shards);
  return mesh;
}

DeviceMesh make_device_mesh(const ProcessGroupPtr& world, int replicas, int tp) {
  FSDP_CHECK_ARG(world != nullptr, "make_device_mesh: the world group is null");
  const int n = world->size();
  FSDP_CHECK_ARG(tp >= 1 && tp <= n && n % tp == 0,
                 "make_device_mesh: a tensor-parallel degree of {} does not divide a world of {} "
                 "ranks; expected one of {}",
                 tp, n, fmt::join(divisors(n), ", "));
  if (tp == 1) return make_device_mesh(world, replicas);
  const int dp = n / tp;
  FSDP_CHECK_ARG(replicas >= 1 && dp % replicas == 0,
                 "make_device_mesh: {} replicas do not divide the {} data-parallel ranks of a "
                 "world of {} at a tensor-parallel degree of {}; expected one of {}",
                 replicas, dp, n, tp, fmt::join(divisors(dp), ", "));
  const int shards = dp / replicas;
  const int r = world->rank();
  const int t = r % tp, d = r / tp;  // (dp, tp) row-major; d = replica * shards + shard
  DeviceMesh mesh;
  mesh.world = world;
  mesh.tp = world->split(d);
  // Colors: ranks of one replica with the same TP index shard together; ranks with the same
  // shard index and TP index replicate.
  mesh.shard = world->split((d / shards) * tp + t);
  if (replicas > 1) mesh.replicate = world->split((d % shards) * tp + t);
  mesh.dp = replicas > 1 ? world->split(t) : mesh.shard;
  return mesh;
}

DeviceMesh make_device_mesh(const ProcessGroupPtr& world, const ProcessGroupPtr& shard,
                            const ProcessGroupPtr& replicate) {
  FSDP_CHECK_ARG(world != nullptr, "make_device_mesh: the world group is null");
  FSDP_CHECK_ARG(shard != nullptr, "make_device_mesh: the shard group is null");
  const int mine_shards = shard->size();
  const int mine_replicas = replicate ? replicate->size() : 1;
  // Every rank's sizes, so that a layout differing between ranks fails on all of them alike.
  auto opts = at::TensorOptions().dtype(at::kLong).device(world->device());
  auto send = at::tensor({static_cast<int64_t>(mine_shards), static_cast<int64_t>(mine_replicas)},
                         at::kLong)
                  .to(opts.device());
  auto all = at::empty({2 * world->size()}, opts);
  world->all_gather(all, send)->wait();
  auto sizes = all.cpu();
  const int64_t* v = sizes.data_ptr<int64_t>();
  for (int r = 0; r < world->size(); ++r) {
    FSDP_CHECK_ARG(v[2 * r] == v[0] && v[2 * r + 1] == v[1],
                   "make_device_mesh: rank {} has a shard group of {} ranks and {} replicas, "
                   "rank 0 has {} and {}; every rank must have the same layout",
                   r, v[2 * r], v[2 * r + 1], v[0], v[1]);
  }
  FSDP_CHECK_ARG(static_cast<int64_t>(mine_shards) * mine_replicas == world->size(),
                 "make_device_mesh: {} shards x {} replicas is {} ranks, but the world has {}",
                 mine_shards, mine_replicas, mine_shards * mine_replicas, world->size());
  FSDP_CHECK_ARG(shard->device_type() == world->device_type() &&
                     (!replicate || replicate->device_type() == world->device_type()),
                 "make_device_mesh: the groups must share the world's device type ({})",
                 c10::DeviceTypeName(world->device_type(), true));
  DeviceMesh mesh{world, shard, mine_replicas > 1 ? replicate : nullptr, nullptr, nullptr};
  return mesh;
}

DeviceMesh flat_mesh(const ProcessGroupPtr& pg) {
  FSDP_CHECK_ARG(pg != nullptr, "flat_mesh: the process group is null");
  return DeviceMesh{pg, pg, nullptr, nullptr, nullptr};
}

}  // namespace fsdp
