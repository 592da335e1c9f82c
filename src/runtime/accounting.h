// Internal: the byte and time counters behind MemoryStats and the pool a tree's large buffers
// come from; part of the tree's TreeContext. Only the owning rank's thread touches them.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include "runtime/buffer_pool.h"

namespace fsdp::detail {

struct Accounting {
  int64_t full_bytes = 0;
  int64_t peak_full_bytes = 0;
  int64_t comm_bytes = 0;
  int64_t peak_comm_bytes = 0;
  // Time the compute thread spent blocked waiting for collectives: exposed communication.
  double exposed_comm_seconds = 0;
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

// Adds the lifetime of the scope to Accounting::exposed_comm_seconds.
class ExposedCommTimer {
 public:
  explicit ExposedCommTimer(Accounting& acct)
      : acct_(acct), start_(std::chrono::steady_clock::now()) {}
  ~ExposedCommTimer() {
    acct_.exposed_comm_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  ExposedCommTimer(const ExposedCommTimer&) = delete;
  ExposedCommTimer& operator=(const ExposedCommTimer&) = delete;

 private:
  Accounting& acct_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace fsdp::detail
