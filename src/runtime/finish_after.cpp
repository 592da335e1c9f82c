// finish_after (fsdp/runtime/comm_hooks.h): a collective's Work followed by the hook's compute.
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <memory>
#include <optional>
#include <utility>

#include "fsdp/runtime/comm_hooks.h"

namespace fsdp {
namespace {

class FinishAfterWork final : public Work {
 public:
  FinishAfterWork(WorkPtr collective, at::Device device, std::function<void()> finish)
      : collective_(std::move(collective)), finish_(std::move(finish)) {
    // The stream current at issue, on the issuing thread: finish() queues the compute there
    // whichever thread completes the work.
    if (!device.is_cpu())
      issue_stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
  }

  // True only once the output holds the values: a collective that completed is finished here
  // (compute, no wait).
  bool is_completed() override {
    if (!done_ && collective_ && collective_->is_completed()) finish();
    return done_;
  }
  void wait() override {
    if (done_) return;
    if (collective_) collective_->wait();
    finish();
  }
  // Timed as the collective's wait; the finishing compute is the caller's.
  void wait_timed(WaitClock& clock) override {
    if (done_) return;
    if (collective_) collective_->wait_timed(clock);
    finish();
  }

 private:
  void finish() {
    collective_.reset();
    std::optional<c10::StreamGuard> on_issue_stream;
    if (issue_stream_) on_issue_stream.emplace(*issue_stream_);
    finish_();
    finish_ = nullptr;
    done_ = true;
  }

  WorkPtr collective_;
  std::function<void()> finish_;
  std::optional<c10::Stream> issue_stream_;  // none on the CPU
  bool done_ = false;
};

}  // namespace

WorkPtr finish_after(WorkPtr collective, at::Device device, std::function<void()> finish) {
  return std::make_shared<FinishAfterWork>(std::move(collective), device, std::move(finish));
}

}  // namespace fsdp
