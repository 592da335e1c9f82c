// Internal: the byte and time counters behind MemoryStats and the pool a tree's large buffers
// come from; part of the tree's TreeContext. Only the owning rank's thread touches them.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>

#include "fsdp/comm/wait_clock.h"
#include "runtime/buffer_pool.h"

namespace fsdp::detail {

struct Accounting {
  int64_t full_bytes = 0;
  int64_t peak_full_bytes = 0;
  int64_t comm_bytes = 0;
  int64_t peak_comm_bytes = 0;
  // Time the compute spent held up by collectives, exposed communication: the training thread
  // blocked in wait() on CPU backends, the compute stream stalled at each wait on CUDA (events,
  // resolved when read). Collectives are waited with wait_timed(exposed_comm_seconds); reading
  // it as a double gives the seconds (wait_clock.h).
  WaitClock exposed_comm_seconds;
  std::shared_ptr<BufferPool> pool = std::make_shared<BufferPool>();

  void add_full(int64_t n) {
    full_bytes += n;
    peak_full_bytes = std::max(peak_full_bytes, full_bytes);
  }
  void add_comm(int64_t n) {
    comm_bytes += n;
    peak_comm_bytes = std::max(peak_comm_bytes, comm_bytes);
  }
};

}  // namespace fsdp::detail
