// Internal: shards of a dim other than 0 (FullyShardOptions::shard_placement_fn, Shard(d) in
// FSDP2) in a checkpoint layer that stores and moves rows of dim 0. Writers turn such a shard
// into rows (as_rows); readers read every row and keep the rank's chunk (chunk_for). A row is
// still written once, by the rank whose rows they are.
#pragma once

#include <ATen/ATen.h>

#include "fsdp/runtime/sharded_tensor.h"

namespace fsdp::detail {

// `s` unchanged when it is rows (shard_dim 0) or replicated. Otherwise its chunks gathered over
// its shard group (a collective: every rank of the group calls it for the same tensor, in the
// same order) and this rank's rows of the whole kept (torch.chunk's rule over the same group),
// as a shard of dim 0 would hold them; the replica and groups are kept.
ShardedTensor as_rows(const ShardedTensor& s);

// The whole tensor from `s`'s chunks (shard_dim > 0), on every rank of its shard group: a
// collective as above.
at::Tensor gather_chunks(const ShardedTensor& s);

// This rank's chunk for `s` (shard_dim > 0) of `whole`, every row of the tensor: the chunk at
// the shard group's rank of that many equal chunks of dim shard_dim.
at::Tensor chunk_for(const at::Tensor& whole, const ShardedTensor& s);

// Where a shard of `s`'s layout that holds rows would sit: a tensor of this rank's rows (its
// dtype `dtype`, on `s.local`'s device), with the offset and groups set; for a writer that fills
// rows before they become chunks (rows_to_chunk).
ShardedTensor rows_target(const ShardedTensor& s, at::ScalarType dtype);
// Rows filled into `rows` (from rows_target(s)) into `s.local` as this rank's chunk: a
// collective over the shard group.
void rows_to_chunk(const ShardedTensor& rows, const ShardedTensor& s);

}  // namespace fsdp::detail
