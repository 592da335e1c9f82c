#include "fsdp/comm/work.h"

#include <chrono>
#include <memory>

#include "fsdp/comm/wait_clock.h"

namespace fsdp {
namespace {

class CompletedWork final : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

}  // namespace

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

// CPU backends: the calling thread is what waits, so its time in wait() is the exposed time.
void Work::wait_timed(WaitClock& clock) {
  const auto start = std::chrono::steady_clock::now();
  wait();
  clock.add(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace fsdp
