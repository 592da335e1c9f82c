// Internal: moving rows of tensors between ranks, from whatever rows each rank has (a state
// dict saved under another layout or world size) to the rows each rank needs (the model's
// layout now). set_model_state_dict and set_optimizer_state_dict are built on it.
#pragma once

#include <string>
#include <vector>

#include "fsdp/checkpoint/state_dict.h"

namespace fsdp::detail {

struct Move {
  std::string name;
  // Rows this rank provides: local [rows, ...] at source_offset (undefined local: none).
  at::Tensor source;
  int64_t source_offset = 0;
  // Rows this rank needs, written into target (which has them all, target_offset first).
  at::Tensor target;
  int64_t target_offset = 0;
  std::vector<int64_t> global_shape;
};

// Collective over `world`: every rank passes the same names in the same order. First checks,
// on every rank alike, that every rank's needed rows are provided by some rank (InvalidArgument
// naming the tensor and rows otherwise, before any target changes); then, tensor by tensor,
// copies locally where each rank already provides exactly what it needs, else all-gathers the
// provided rows (padded to the most any rank provides) and copies out each rank's own. Sources
// are converted to the targets' dtype.
void redistribute(std::vector<Move>& moves, ProcessGroup& world);

}  // namespace fsdp::detail
