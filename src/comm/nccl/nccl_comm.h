// Internal: one NCCL communicator, shared by its group, the Works it issued and the watchdog.
//
// Every call on the communicator goes through this object under one lock, so that the
// watchdog's abort can never interleave with a launch or an error query (an aborted
// communicator is freed memory to NCCL). The communicator is non-blocking (ncclConfig_t
// blocking = 0): its initialisation, split and the calls that set up connections return
// ncclInProgress, and this object polls them until they finish or the timeout passes, so a
// peer that never arrives becomes a TimeoutError instead of a hang.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "comm/nccl/cuda_check.h"

namespace fsdp::detail {

class NcclComm {
 public:
  // ncclCommInitRankConfig, non-blocking, polled until done. On `timeout` (0: none) the
  // half-made communicator is aborted and TimeoutError says a peer did not join.
  static std::shared_ptr<NcclComm> init(int rank, int world, int device, const ncclUniqueId& id,
                                        std::chrono::milliseconds timeout);
  // ncclCommSplit (collective over this communicator): the ranks that pass the same color form
  // the child, ordered by `key`. The child inherits the timeout and is non-blocking too.
  //
  // On a non-blocking parent the split is an asynchronous job of the parent: ncclCommSplit
  // returns ncclInProgress, and NCCL writes the child's handle only when that job ends (NCCL's
  // init.cc: the job stores it on exit, success or failure), so the parent is settled first,
  // then the child's own initialisation. Errors:
  //  - ncclCommSplit refuses at once: CommError; nothing was started, the parent is usable.
  //  - the parent's job fails or outlasts the timeout: CommError or TimeoutError; the parent
  //    (and a child NCCL wrote) is aborted, every later call on it throws with that cause.
  //  - the child fails its own initialisation: CommError; the child is aborted, the parent,
  //    whose part is done, stays usable.
  // The slot NCCL writes the handle into is on the heap and is never freed while NCCL may still
  // write it (a failed split leaks its 8 bytes rather than risk a late write).
  std::shared_ptr<NcclComm> split(int color, int key, int child_world);

  // Flushes (ncclCommFinalize, bounded by the timeout) and destroys; after an abort, nothing
  // (ncclCommAbort freed it). While an exception propagates (the process leaves on an error),
  // aborts instead, waiting at most until leaving_deadline(): finalising waits for peers that
  // may never be done. Never throws.
  ~NcclComm();
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  // Runs `call(comm)`, one NCCL call on this communicator, and waits out ncclInProgress.
  // Throws CommError with the abort's cause when the communicator was aborted, CommError with
  // NCCL's text when the call fails, TimeoutError (and aborts) when it stays in progress past
  // the timeout.
  template <typename Call>
  void run(const char* op, Call call) {
    std::lock_guard<std::mutex> lock(mu_);
    throw_if_aborted(op);
    finish_locked(op, call(comm_));
  }

  // Throws CommError when the communicator was aborted or NCCL reports an asynchronous error
  // (ncclInProgress is not one). For a wait.
  void check(const char* op);
  // The watchdog's question: NCCL's asynchronous error as a sentence, or "" when there is none
  // (or the communicator is already aborted).
  std::string async_error();
  // Aborts the communicator once, remembering `cause` for every later call. Never throws. The
  // flag is set under the lock, so no call starts on the communicator after it; ncclCommAbort
  // itself (it joins NCCL's threads: it can take seconds) runs after the lock is released, so
  // launches and waits on other threads throw the cause at once instead of queueing behind it.
  void abort(const std::string& cause);
  // The same when this process leaves on an error, its wait bounded: ncclCommAbort can wait for
  // peers that do not abort too (NCCL issues 863 and 1777), which would hold the process as
  // finalising does. Past `deadline` the abort goes on in a detached thread and this returns
  // false; true once aborted (or when it already was).
  bool abort_leaving(const std::string& cause, std::chrono::steady_clock::time_point deadline);
  // The process's one deadline for leaving on an error, kLeavingAbortLimit after its first call:
  // every abort and stream drain on the way out waits at most until then (a process has several
  // communicators, and when one abort hangs the others usually do too).
  static std::chrono::steady_clock::time_point leaving_deadline();
  static constexpr std::chrono::milliseconds kLeavingAbortLimit{10000};
  bool aborted() const { return aborted_; }

  int rank() const { return rank_; }
  int world() const { return world_; }
  int device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  NcclComm(ncclComm_t comm, int rank, int world, int device, std::chrono::milliseconds timeout)
      : comm_(comm), rank_(rank), world_(world), device_(device), timeout_(timeout) {}

  void throw_if_aborted(const char* op);
  // After a call returned `rc`: success, an error (thrown), or in progress (polled).
  void finish_locked(const char* op, ncclResult_t rc);
  // Polls ncclCommGetAsyncError until the communicator leaves ncclInProgress. `late` says what
  // a timeout means for this operation.
  void settle_locked(const char* op, const char* late);
  // Marks the communicator aborted with `cause` (under mu_) and returns the handle to abort, or
  // nullptr when it already was.
  ncclComm_t mark_aborted_locked(const std::string& cause);
  ncclComm_t mark_aborted(const std::string& cause);  // the same, taking mu_
  // ncclCommAbort of `doomed` (this communicator's handle), waited for until `deadline` (then
  // left running in its thread, said on stderr); true when it returned.
  bool abort_by(ncclComm_t doomed, std::chrono::steady_clock::time_point deadline);
  // mark_aborted_locked and ncclCommAbort, for failures met by a call already holding mu_.
  void abort_locked(const std::string& cause);

  std::mutex mu_;  // every use of comm_
  ncclComm_t comm_;
  int rank_, world_, device_;
  std::chrono::milliseconds timeout_;
  std::atomic<bool> aborted_{false};
  std::string cause_;  // why it was aborted; under mu_
};

}  // namespace fsdp::detail
