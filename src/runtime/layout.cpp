#include "fsdp/runtime/layout.h"

#include <algorithm>

#include "util/check.h"

namespace fsdp {

ShardRange shard_range(int64_t dim0, int world, int rank) {
  FSDP_CHECK_ARG(world >= 1, "shard_range: world must be >= 1, got {}", world);
  FSDP_CHECK_ARG(rank >= 0 && rank < world, "shard_range: rank {} not in [0, {})", rank, world);
  FSDP_CHECK_ARG(dim0 >= 0, "shard_range: dim0 must be >= 0, got {}", dim0);
  ShardRange r;
  r.rows_per_rank = (dim0 + world - 1) / world;
  r.begin = std::min(dim0, rank * r.rows_per_rank);
  r.end = std::min(dim0, r.begin + r.rows_per_rank);
  return r;
}

int64_t ParamShape::padded_numel(int world) const {
  return shard_range(dim0, world, 0).rows_per_rank * row_numel;
}

FlatLayout flat_layout(const std::vector<ParamShape>& params, int world,
                       const std::vector<bool>& in_buffer) {
  FlatLayout l;
  for (size_t i = 0; i < params.size(); ++i) {
    const bool in = in_buffer.empty() || in_buffer[i];
    l.offset.push_back(in ? l.total : -1);
    if (in) l.total += params[i].padded_numel(world);
  }
  return l;
}

UnitSizes unit_sizes(const std::vector<ParamShape>& params, int world) {
  UnitSizes s;
  for (const auto& p : params) {
    s.full += p.numel();
    s.padded += p.padded_numel(world);
    s.rank0 += shard_range(p.dim0, world, 0).rows() * p.row_numel;
  }
  return s;
}

}  // namespace fsdp
