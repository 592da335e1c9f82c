// Internal: the Work of one NCCL collective, and the CUDA measurement of a stream's wait.
#pragma once

#include <ATen/ATen.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl/nccl_comm.h"
#include "fsdp/comm/wait_clock.h"
#include "fsdp/comm/work.h"

namespace fsdp::detail {

// How a collective's completion event stands.
struct EventState {
  enum Kind { kRunning, kDone, kFailed } kind = kRunning;
  std::string error;  // kFailed: CUDA's error (an illegal address, a failed launch, ...)
};
// cudaEventQuery without blocking: cudaErrorNotReady is "running", any other error "failed".
EventState query_event(cudaEvent_t event);

class NcclWork final : public Work {
 public:
  // `done` is recorded on the communication stream after the collective; `issued_on` is the
  // caller's stream at issue, on which `stash` (every tensor the collective reads or writes) was
  // allocated. Takes ownership of `done`.
  NcclWork(std::shared_ptr<NcclComm> comm, cudaEvent_t done, cudaStream_t issued_on,
           std::vector<at::Tensor> stash, bool host_blocking, const char* op);
  ~NcclWork() override;

  const char* op() const { return op_; }
  std::chrono::steady_clock::time_point issued() const { return issued_; }
  EventState query() const { return query_event(done_); }

  // True once the collective's event completed, or failed.
  bool is_completed() override { return query().kind != EventState::kRunning; }
  // Orders the caller's current stream after the collective (a barrier blocks the host), and
  // throws CommError when the communicator was aborted, NCCL reports an asynchronous error or
  // the collective failed on the GPU.
  void wait() override { wait_impl(nullptr); }
  // wait(), adding to `clock` how long the caller's stream stalls at this wait: two timing
  // events around cudaStreamWaitEvent, read when the clock is read.
  void wait_timed(WaitClock& clock) override { wait_impl(&clock); }

 private:
  void wait_impl(WaitClock* clock);

  std::shared_ptr<NcclComm> comm_;
  cudaEvent_t done_;
  cudaStream_t issued_on_;
  // The collective's tensors, so that memory a caller dropped is not reused while NCCL works
  // on it. Released by a wait() on the issuing stream (c10d unstashes there too): the caching
  // allocator hands a freed block only to later work of the stream it was allocated on, which
  // now follows the collective. Otherwise they live until the group sees the event complete.
  std::vector<at::Tensor> stash_;
  bool host_blocking_;
  const char* op_;
  std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

}  // namespace fsdp::detail
