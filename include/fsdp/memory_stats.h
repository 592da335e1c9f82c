// Per-rank accounting of FSDP units: memory and exposed communication time.
#pragma once

#include <cstdint>

namespace fsdp {

struct MemoryStats {
  int64_t sharded_param_bytes = 0;  // this rank's parameter shards (original dtype)
  int64_t sharded_grad_bytes = 0;   // this rank's gradient shards now held
  int64_t full_param_bytes = 0;     // full (gathered) parameters alive now
  int64_t peak_full_param_bytes = 0;
  int64_t comm_buffer_bytes = 0;  // all-gather and reduce-scatter buffers alive now
  int64_t peak_comm_buffer_bytes = 0;
  // Freed CPU buffers kept for reuse by the next step (gathers, reductions, full parameters).
  int64_t cached_buffer_bytes = 0;
  // Seconds the training thread waited for collectives since the units were created: the
  // communication that compute did not hide. Not memory, but counted in the same place.
  double exposed_comm_seconds = 0;
};

}  // namespace fsdp
