// Internal: runs a CPU backend's collectives in order on one worker thread per group, so the
// calling thread returns at once with a Work and computes while bytes move (the design of
// c10d's ProcessGroupMPI). Operations run in submission order, which keeps every rank's
// sequence identical when callers issue identical sequences.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "fsdp/work.h"

namespace fsdp::detail {

// A Work completed by another thread. wait() blocks until finish() and rethrows its error.
class AsyncWork : public Work {
 public:
  bool is_completed() override;
  void wait() override;
  void finish(std::exception_ptr error);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// A Work that finished when it was created (synchronous backends, empty operations).
class CompletedWork : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

class OpQueue {
 public:
  OpQueue();
  // Runs the operations still queued, then joins the worker. Never throws.
  ~OpQueue();
  OpQueue(const OpQueue&) = delete;
  OpQueue& operator=(const OpQueue&) = delete;

  // Queues `op`; the returned Work completes when it has run, carrying what it threw.
  // `label` (a string literal) names the range the op runs under in libtorch's profiler, on
  // this queue's worker thread: "fsdp::comm::all_gather", ...
  WorkPtr submit(const char* label, std::function<void()> op);

 private:
  void run();

  struct Item {
    const char* label;
    std::function<void()> op;
    std::shared_ptr<AsyncWork> work;
  };
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  bool stopping_ = false;
  std::thread worker_;
};

}  // namespace fsdp::detail
