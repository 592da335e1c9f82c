// Work: the handle every asynchronous collective returns.
#pragma once

#include <memory>

namespace fsdp {

class WaitClock;

// Contract:
// - is_completed() never blocks; true once the operation finished (successfully or not).
// - wait() returns when the result may be used by the caller: on CPU backends the output
//   tensors hold the result; on CUDA backends work queued afterwards on the caller's current
//   stream is ordered after the collective (the host does not block). wait() rethrows the
//   error the operation stored (CommError, TimeoutError). It may be called more than once.
// - wait_timed(clock) is wait() that also adds to `clock` how long the caller was held up: the
//   calling thread's time in wait() on CPU backends (the default), the time the caller's stream
//   stalls on CUDA (measured by events, read later: wait_clock.h).
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
  virtual void wait_timed(WaitClock& clock);
};

using WorkPtr = std::shared_ptr<Work>;

// A Work that finished when it was made: what a synchronous operation, an empty one, or a comm
// hook that completed its collective before returning is waited on as (both calls return at once).
WorkPtr completed_work();

}  // namespace fsdp
