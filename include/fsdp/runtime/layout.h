// Sharding arithmetic: how a parameter's dim 0 is split over ranks. Pure functions, no backend.
//
// The rule is torch.chunk's, as FSDP2 uses it: every rank gets ceil(dim0 / world) rows except
// the trailing ones, which get fewer or none. Sizes that do not divide are padded in the
// communication buffers (every rank contributes ceil(dim0 / world) rows), never rejected.
#pragma once

#include <cstdint>

namespace fsdp {

struct ShardRange {
  int64_t rows_per_rank = 0;  // ceil(dim0 / world): the padded rows every rank communicates
  int64_t begin = 0;          // first row this rank owns
  int64_t end = 0;            // one past the last row this rank owns (begin when it owns none)
  int64_t rows() const { return end - begin; }
};

// The rows of a dim-0 extent `dim0` that `rank` of `world` owns. dim0 >= 0, 0 <= rank < world.
ShardRange shard_range(int64_t dim0, int world, int rank);

}  // namespace fsdp
