// Internal: what one tree of units (a root and every unit inside it) shares, created by the
// root at its lazy init and handed to every unit and, through them, every param group and
// parameter. FSDP2's FSDPStateContext and FSDPCommContext in one object.
//
// Until the root's lazy init a unit works on a context of its own (a unit used alone, or one
// whose root has not run yet); lazy init moves the whole tree onto the root's.
#pragma once

#include <deque>
#include <vector>

#include "runtime/accounting.h"

namespace fsdp::detail {

class UnitState;
class ParamGroup;

struct TreeContext {
  // Every unit of the tree, root first, in a deterministic order (children after parents).
  // Raw pointers: the root's children_ own the other units.
  std::vector<UnitState*> units;
  // Units in the order their forward started, this step and the previous one (forward
  // prefetch follows the previous step's order).
  std::vector<UnitState*> forward_order, last_forward_order;
  // Units in the order their forward ended: backward visits them in reverse (backward prefetch).
  std::vector<UnitState*> post_forward_order;
  // Param groups whose reduce-scatter is in flight, oldest first.
  std::deque<ParamGroup*> reductions_in_flight;
  // Whether the end-of-backward callback is queued on the autograd engine for this backward:
  // a backward of the tree is running.
  bool final_callback_queued = false;
  // Checkpointed forwards being recomputed (nested checkpoints recompute inside each other).
  int recompute_depth = 0;
  // Byte and time counters (MemoryStats) and the buffer pool of the tree's collectives.
  Accounting acct;
};

}  // namespace fsdp::detail
