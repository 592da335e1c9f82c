// Work: the handle every asynchronous collective returns.
#pragma once

#include <memory>

namespace fsdp {

// Contract:
// - is_completed() never blocks; true once the operation finished (successfully or not).
// - wait() returns when the result may be used by the caller: on CPU backends the output
//   tensors hold the result; on CUDA backends work queued afterwards on the caller's current
//   stream is ordered after the collective (the host does not block). wait() rethrows the
//   error the operation stored (CommError, TimeoutError). It may be called more than once.
class Work {
 public:
  virtual ~Work() = default;
  virtual bool is_completed() = 0;
  virtual void wait() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace fsdp
