// Internal: runs a CPU backend's collectives in order on one worker thread per group, so the
// calling thread returns at once with a Work and computes while bytes move (the design of
// c10d's ProcessGroupMPI). Operations run in submission order, which keeps every rank's
// sequence identical when callers issue identical sequences.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "fsdp/comm/work.h"

namespace fsdp::detail {

// How long a queued operation may take, from submission to completion, before a wait() on it
// gives up; and what giving up means for the backend.
struct QueueDeadline {
  std::chrono::milliseconds timeout{0};  // 0: wait forever
  // Runs on the waiting thread when an operation is late; must throw (CommError naming the
  // operation). `label` is the operation's range name ("fsdp::comm::all_gather").
  std::function<void(const char* label, std::chrono::milliseconds waited)> on_timeout;
};

// A Work completed by another thread. wait() blocks until finish() and rethrows its error, or
// until the queue's deadline passes.
class AsyncWork : public Work {
 public:
  AsyncWork(const char* label, std::shared_ptr<const QueueDeadline> deadline);
  bool is_completed() override;
  void wait() override;
  void finish(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
  const char* label_;
  std::shared_ptr<const QueueDeadline> deadline_;
  std::chrono::steady_clock::time_point submitted_ = std::chrono::steady_clock::now();
};

class OpQueue {
 public:
  explicit OpQueue(QueueDeadline deadline = {});
  // Runs the operations still queued, then joins the worker. Never throws. (A backend whose
  // worker is stuck in an operation that cannot be cancelled must not destroy its queue.)
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Queues `op`; the returned Work completes when it has run, carrying what it threw.
  // `label` (a string literal) names the range the op runs under in libtorch's profiler, on
  // this queue's worker thread: "fsdp::comm::all_gather", ...; `bytes`, the size of the
  // collective's larger buffer, is recorded as the range's input (traces with shapes).
  WorkPtr submit(const char* label, int64_t bytes, std::function<void()> op);

 private:
  void run();

  struct Item {
    const char* label;
    int64_t bytes;
    std::function<void()> op;
    std::shared_ptr<AsyncWork> work;
  };
  std::shared_ptr<const QueueDeadline> deadline_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace fsdp::detail
