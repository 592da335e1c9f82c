#include "fsdp/comm/work.h"

#include <chrono>

#include "fsdp/comm/wait_clock.h"

namespace fsdp {

// CPU backends: the calling thread is what waits, so its time in wait() is the exposed time.
void Work::wait_timed(WaitClock& clock) {
  const auto start = std::chrono::steady_clock::now();
  wait();
  clock.add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace fsdp
