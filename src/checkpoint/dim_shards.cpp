#include "checkpoint/dim_shards.h"

#include "fsdp/parallel/tensor_parallel.h"
#include "fsdp/runtime/layout.h"

namespace fsdp::detail {

at::Tensor gather_chunks(const ShardedTensor& s) {
  at::NoGradGuard no_grad;
  return tp::gather_dim(s.local.detach(), s.shard_dim, s.global_shape.at(s.shard_dim),
                        s.shard_group);
}

ShardedTensor as_rows(const ShardedTensor& s) {
  if (s.shard_dim == 0 || s.replicated || !s.local.defined()) return s;
  ShardedTensor out = s;
  const at::Tensor whole = gather_chunks(s);
  const auto rows = shard_range(s.global_shape.at(0), s.shard_group->size(), s.shard_group->rank());
  out.local = whole.narrow(0, rows.begin, rows.rows()).contiguous();
  out.row_offset = rows.begin;
  out.shard_dim = 0;
  return out;
}

at::Tensor chunk_for(const at::Tensor& whole, const ShardedTensor& s) {
  const int world = s.shard_group->size();
  const int64_t chunk = s.global_shape.at(s.shard_dim) / world;
  return whole.narrow(s.shard_dim, s.shard_group->rank() * chunk, chunk);
}

ShardedTensor rows_target(const ShardedTensor& s, at::ScalarType dtype) {
  ShardedTensor out = s;
  const auto rows = shard_range(s.global_shape.at(0), s.shard_group->size(), s.shard_group->rank());
  auto shape = s.global_shape;
  shape[0] = rows.rows();
  out.local = at::empty(shape, s.local.options().dtype(dtype));
  out.row_offset = rows.begin;
  out.shard_dim = 0;
  return out;
}

void rows_to_chunk(const ShardedTensor& rows, const ShardedTensor& s) {
  at::NoGradGuard no_grad;
  // The whole tensor from every rank's rows (torch.chunk's rows, as rows_target made them).
  const at::Tensor whole = tp::gather_dim(rows.local, 0, s.global_shape.at(0), s.shard_group);
  s.local.copy_(chunk_for(whole, s));
}

}  // namespace fsdp::detail
