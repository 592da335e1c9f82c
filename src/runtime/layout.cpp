#include "fsdp/sharding.h"

#include <algorithm>

#include "fsdp/errors.h"

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

}  // namespace fsdp
