// Internal: byte counters of one tree of units (a root and everything inside it), for
// MemoryStats. Only the owning rank's thread touches them.
#pragma once

#include <algorithm>
#include <cstdint>

namespace fsdp::detail {

struct Accounting {
  int64_t full_bytes = 0;
  int64_t peak_full_bytes = 0;
  int64_t comm_bytes = 0;
  int64_t peak_comm_bytes = 0;

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
