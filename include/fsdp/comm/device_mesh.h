// DeviceMesh: the world's ranks laid out as replicas x shards, for hybrid sharding (HSDP),
// FSDP2's two-dimensional DeviceMesh of shape (replicate, shard).
//
// Parameters are sharded over the `shard` group (the ranks of one replica hold one copy of the
// model between them) and replicated across the `replicate` group. A unit's gradients are
// reduce-scattered within its shard group, then all-reduced across replicas, averaged over the
// whole world: the slow link between machines carries only already-sharded gradients once.
//
// Layout, as torch's init_device_mesh(..., (replicas, shards)): rank r is shard r % shards of
// replica r / shards, so a shard group is `shards` consecutive ranks. Launchers number the
// ranks of one machine consecutively, which puts each shard group on one machine when shards
// divides the ranks per machine.
//
//   auto mesh = fsdp::make_device_mesh(world, /*replicas=*/2);
//   for (auto& layer : model->layers) fsdp::fully_shard(layer, mesh);
//   auto root = fsdp::fully_shard(model, mesh);
//   fsdp::clip_grad_norm_(root.parameters(), 1.0, mesh);
#pragma once

#include "fsdp/comm/process_group.h"

namespace fsdp {

struct DeviceMesh {
  ProcessGroupPtr world;      // every rank: checkpoints, export, agreement
  ProcessGroupPtr shard;      // the ranks of this rank's replica (and TP index)
  ProcessGroupPtr replicate;  // this rank's peers in the other replicas; null with one replica
  // Tensor parallelism (make_device_mesh(world, replicas, tp)): the ranks that split each
  // matmul with this one (fsdp/parallel/tensor_parallel.h); null without.
  ProcessGroupPtr tp;
  // With tensor parallelism: the ranks of this rank's TP index (replicas x shards), which hold
  // slices of the same shapes; null without (the world is).
  ProcessGroupPtr dp;

  int replicas() const { return replicate ? replicate->size() : 1; }
  int shards() const { return shard->size(); }
  int tp_size() const { return tp ? tp->size() : 1; }
  // This rank's replica (0 .. replicas - 1) and its place in it.
  int replica_index() const { return replicate ? replicate->rank() : 0; }
  int shard_index() const { return shard->rank(); }
  int tp_index() const { return tp ? tp->rank() : 0; }
  bool hybrid() const { return replicate != nullptr; }
  // Data parallelism: the ranks that see different batches (replicas x shards; the TP ranks
  // of one data-parallel rank see the same batch), and this rank's place among them.
  int dp_size() const { return replicas() * shards(); }
  int dp_index() const { return replica_index() * shards() + shard_index(); }
  const ProcessGroupPtr& dp_group() const { return dp ? dp : world; }
};

// Splits `world` into `replicas` replicas of world->size() / replicas ranks each (two
// ProcessGroup::split calls; collective: every rank of `world` calls it with the same number).
// replicas == 1 is plain FSDP (shard is world itself, no replicate group); replicas ==
// world->size() is DDP (each rank holds everything; gradients are all-reduced).
// Throws InvalidArgument, before any communication, when `world` is null or `replicas` is not a
// divisor of the world size (the message names both and lists the divisors).
DeviceMesh make_device_mesh(const ProcessGroupPtr& world, int replicas);

// Tensor parallelism beside (hybrid) sharding: the mesh (replicas, shards, tp) of torch's
// init_device_mesh(..., (replicate, shard, tp)), row-major, so rank r is TP rank r % tp and a TP
// group is `tp` consecutive ranks (one machine's GPUs, where TP's per-layer all-reduces belong).
// Parameters are sharded over the `shard` group of ranks with the same TP index. Collective
// over `world` (three splits). Throws InvalidArgument, before any communication, when replicas
// x tp does not divide the world (naming the sizes and listing what would).
DeviceMesh make_device_mesh(const ProcessGroupPtr& world, int replicas, int tp);

// A mesh from groups the caller made (for example with its own splits). Collective over
// `world`: every rank checks that its groups multiply to the world size and that every rank
// has the same shard and replica sizes, so a layout that differs between ranks is reported on
// every rank (InvalidArgument naming the ranks and sizes) instead of hanging later. `replicate`
// may be null when `shard` spans the world.
DeviceMesh make_device_mesh(const ProcessGroupPtr& world, const ProcessGroupPtr& shard,
                            const ProcessGroupPtr& replicate);

// The mesh of plain FSDP over `pg` (no communication).
DeviceMesh flat_mesh(const ProcessGroupPtr& pg);

}  // namespace fsdp
