// What fully_shard's units hold and how long they waited, per rank (FSDPModule::memory_stats,
// comm_stats).
#pragma once

#include <cstdint>

namespace fsdp {

// The deprecated members below are named by MemoryStats's implicit constructors and assignments;
// a warning there would reach every program that copies one. Only a program's own use of an old
// name warns.
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
struct MemoryStats {
  // The unit and every unit inside it:
  int64_t sharded_param_bytes = 0;  // this rank's parameter shards (original dtype)
  int64_t sharded_grad_bytes = 0;   // this rank's gradient shards now held
  // Full gradients kept unsharded while gradient sync is off (set_requires_gradient_sync).
  int64_t unsharded_grad_bytes = 0;

  // The whole tree the unit belongs to (its root and every unit inside it), whose units share
  // their buffers:
  struct Tree {
    int64_t full_param_bytes = 0;  // full (gathered) parameters alive now
    int64_t peak_full_param_bytes = 0;
    int64_t comm_buffer_bytes = 0;  // all-gather and reduce-scatter buffers alive now
    int64_t peak_comm_buffer_bytes = 0;
    // Freed CPU buffers kept for reuse by the next step (gathers, reductions, full parameters).
    int64_t cached_buffer_bytes = 0;
  } tree;

  // Deprecated (since 0.2.0, removed in 0.3.0): 0.1.0 had the Tree's fields in MemoryStats
  // itself. memory_stats() fills them with the same values as tree.<the same name>, so programs
  // that read them keep working (writing one changes only that copy). Declared last: positional
  // initialisation of the fields above is unchanged.
  [[deprecated("use tree.full_param_bytes")]] int64_t full_param_bytes = 0;
  [[deprecated("use tree.peak_full_param_bytes")]] int64_t peak_full_param_bytes = 0;
  [[deprecated("use tree.comm_buffer_bytes")]] int64_t comm_buffer_bytes = 0;
  [[deprecated("use tree.peak_comm_buffer_bytes")]] int64_t peak_comm_buffer_bytes = 0;
  [[deprecated("use tree.cached_buffer_bytes")]] int64_t cached_buffer_bytes = 0;
};

#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

struct CommStats {
  // Seconds the tree's computation waited for collectives since the units were created: the
  // communication that compute did not hide (exposed communication). On CPU engines, the
  // training thread's time in wait(); on CUDA, the time the compute stream stalled on each
  // collective's event (timed with CUDA events, read once they complete; see WaitClock), since
  // the host's wait() returns at once there.
  double exposed_seconds = 0;
};

}  // namespace fsdp
