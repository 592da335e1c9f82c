// Sharding layout and schedule: the arithmetic the runtime does, in one place, so that the
// runtime, the planner (tools/planner.h) and the full state dicts (which gather rows padded as
// the runtime pads them) compute the same numbers.
// Pure functions, no backend.
//
// Rows: torch.chunk's rule, as FSDP2 uses it: every rank gets ceil(dim0 / world) rows except
// the trailing ones, which get fewer or none. Sizes that do not divide are padded in the
// communication buffers (every rank contributes ceil(dim0 / world) rows), never rejected.
//
// Flat buffers: a unit's collectives move one flat buffer per rank, each parameter's padded
// rows one after another ([world, total] for the gathered or reduced buffer).
//
// Schedule: in backward, after each unit's reduce-scatter is issued, older reductions are
// finished so that at most kReductionsInFlight units' gradient buffers stay alive; with hybrid
// sharding the one before the newest moves on to its all-reduce across replicas instead of
// finishing. Forward and backward prefetch kGathersAhead unit ahead in the recorded order;
// explicit prefetch lists (set_modules_to_forward_prefetch) may name more, which the planner
// takes as PlanRequest::gathers_ahead.
#pragma once

#include <cstdint>
#include <vector>

namespace fsdp {

struct ShardRange {
  int64_t rows_per_rank = 0;  // ceil(dim0 / world): the padded rows every rank communicates
  int64_t begin = 0;          // first row this rank owns
  int64_t end = 0;            // one past the last row this rank owns (begin when it owns none)
  int64_t rows() const { return end - begin; }
};

// The rows of a dim-0 extent `dim0` that `rank` of `world` owns. dim0 >= 0, 0 <= rank < world.
ShardRange shard_range(int64_t dim0, int world, int rank);

// A parameter as the layout sees it: rows of dim 0 and elements per row.
struct ParamShape {
  int64_t dim0 = 0;
  int64_t row_numel = 1;
  int64_t numel() const { return dim0 * row_numel; }
  // Elements every rank contributes to a collective over `world` ranks: ceil(dim0 / world)
  // rows, the last rank's padded.
  int64_t padded_numel(int world) const;
};

// Where each parameter sits in a unit's flat buffer.
struct FlatLayout {
  std::vector<int64_t> offset;  // per parameter; -1 when the parameter is not in the buffer
  int64_t total = 0;            // elements per rank
};
// `in_buffer[i]` false leaves parameter i out (the reduce-scatter carries only parameters that
// take a gradient); empty: every parameter.
FlatLayout flat_layout(const std::vector<ParamShape>& params, int world,
                       const std::vector<bool>& in_buffer = {});

// A unit's sizes over `world` ranks (elements).
struct UnitSizes {
  int64_t full = 0;    // every parameter's full elements
  int64_t padded = 0;  // elements each rank contributes to the unit's flat buffer
  int64_t rank0 = 0;   // elements of rank 0's shards (the largest)
};
UnitSizes unit_sizes(const std::vector<ParamShape>& params, int world);

// Bytes of one collective's send and receive buffers over `world` ranks: the rank's flat
// buffer and the [world, padded] one (all-gather: input and output; reduce-scatter: output and
// input).
inline int64_t collective_buffer_bytes(int64_t padded, int world, int dtype_bytes) {
  return (1 + static_cast<int64_t>(world)) * padded * dtype_bytes;
}

// The schedule (see the file comment).
inline constexpr int kGathersAhead = 1;
inline constexpr int kReductionsInFlight = 2;

}  // namespace fsdp
