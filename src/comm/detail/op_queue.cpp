#include "comm/detail/op_queue.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include "fsdp/errors.h"
#include "util/profiler_range.h"

namespace fsdp::detail {

AsyncWork::AsyncWork(const char* label, std::shared_ptr<const QueueDeadline> deadline)
    : label_(label), deadline_(std::move(deadline)) {}

bool AsyncWork::is_completed() {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void AsyncWork::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!deadline_ || deadline_->timeout.count() <= 0) {
    cv_.wait(lock, [&] { return done_; });
  } else if (!cv_.wait_until(lock, submitted_ + deadline_->timeout, [&] { return done_; })) {
    lock.unlock();
    deadline_->on_timeout(label_, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::chrono::steady_clock::now() - submitted_));
    throw Error(fmt::format("{}: timed out", label_));  // on_timeout did not throw
  }
  if (error_) std::rethrow_exception(error_);
}

void AsyncWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::move(error);
    done_ = true;
  }
  cv_.notify_all();
}

OpQueue::OpQueue(QueueDeadline deadline)
    : deadline_(std::make_shared<const QueueDeadline>(std::move(deadline))),
      worker_([this] { run(); }) {}

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

WorkPtr OpQueue::submit(const char* label, int64_t bytes, std::function<void()> op) {
  auto work = std::make_shared<AsyncWork>(label, deadline_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    items_.push_back(Item{label, bytes, std::move(op), work});
  }
  cv_.notify_one();
  return work;
}

void OpQueue::run() {
  // This thread joins a profiling session the training thread starts (and leaves it when it
  // ends), so its ranges land in the same trace: libtorch's profiler records the threads it
  // was enabled on.
  bool profiling = false;
  for (;;) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !items_.empty(); });
      if (items_.empty()) return;  // stopping and drained
      item = std::move(items_.front());
      items_.pop_front();
    }
    const bool now = torch::autograd::profiler::isProfilerEnabledInMainThread();
    if (now != profiling) {
      if (now) {
        torch::autograd::profiler::enableProfilerInChildThread();
      } else {
        torch::autograd::profiler::disableProfilerInChildThread();
      }
      profiling = now;
    }
    std::exception_ptr error;
    try {
      FSDP_RANGE_BYTES(item.label, item.bytes);
      item.op();
    } catch (...) {
      error = std::current_exception();
    }
    item.work->finish(error);
  }
}

}  // namespace fsdp::detail
