#include "comm/nccl/nccl_comm.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <thread>

#include "fsdp/errors.h"

namespace fsdp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// Waits out one step of polling: spin briefly (most calls finish within microseconds), then
// sleep, so a long wait costs no core.
void backoff(int polls) {
  if (polls < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// ncclCommAbort on a detached thread, waited for until `deadline`; true when it returned. The
// thread owns nothing of the caller's (the handle and the device are copies), so the caller may
// go on and the process may exit while it still waits.
bool abort_within(ncclComm_t comm, int device, Clock::time_point deadline) {
  auto done = std::make_shared<std::promise<void>>();
  auto returned = done->get_future();
  try {
    std::thread([comm, device, done] {
      CudaDeviceGuard guard(device);
      ncclCommAbort(comm);
      done->set_value();
    }).detach();
  } catch (const std::exception&) {
    // No thread to be had (out of memory, a thread limit: the error this process may be
    // leaving on). Called from destructors, so never throw: abort here, unbounded.
    CudaDeviceGuard guard(device);
    ncclCommAbort(comm);
    return true;
  }
  return returned.wait_until(deadline) == std::future_status::ready;
}

}  // namespace

std::shared_ptr<NcclComm> NcclComm::init(int rank, int world, int device, const ncclUniqueId& id,
                                         std::chrono::milliseconds timeout) {
  CudaDeviceGuard guard(device);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  // Non-blocking: ncclCommInitRank blocks until every rank joined, forever if one died first.
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRankConfig(&comm, world, id, rank, &config);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    if (comm) ncclCommAbort(comm);
    throw CommError("nccl", "init", rank, world,
                    fmt::format("ncclCommInitRankConfig returned {}: {}", ncclGetErrorString(rc),
                                ncclGetLastError(nullptr)));
  }
  std::shared_ptr<NcclComm> out(new NcclComm(comm, rank, world, device, timeout));
  std::lock_guard<std::mutex> lock(out->mu_);
  out->settle_locked("init",
                     "a peer did not join the communicator (it died or hangs before its init, or "
                     "holds another unique id)");
  return out;
}

std::shared_ptr<NcclComm> NcclComm::split(int color, int key, int child_world) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted("split");
  CudaDeviceGuard guard(device_);
  // config nullptr: the child inherits this communicator's (non-blocking) configuration.
  auto slot = std::make_unique<ncclComm_t>(nullptr);
  const ncclResult_t rc = ncclCommSplit(comm_, color, key, slot.get(), nullptr);
  if (rc != ncclSuccess && rc != ncclInProgress) {
    // Refused before any job started (NCCL clears the slot on that path).
    const std::string why = ncclGetLastError(comm_);
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclSuccess) {
      throw CommError("nccl", "split", rank_, world_,
                      fmt::format("ncclCommSplit returned {}: {}; nothing was started and the "
                                  "parent communicator is unchanged",
                                  ncclGetErrorString(rc), why));
    }
    const std::string cause =
        fmt::format("ncclCommSplit returned {}: {}", ncclGetErrorString(rc), why);
    abort_locked(cause + "; the communicator was aborted");
    throw CommError("nccl", "split", rank_, world_, cause + "; the communicator was aborted");
  }
  // The parent first: the child's handle exists only once the parent's job is over.
  try {
    settle_locked("split", "a peer did not take part in the split");
  } catch (...) {
    // settle_locked aborted the parent, which stops the child's initialisation too. NCCL may
    // still write the slot: it is left allocated (leaked) on purpose.
    ncclComm_t* leaked = slot.release();
    if (ncclComm_t child = __atomic_load_n(leaked, __ATOMIC_ACQUIRE)) ncclCommAbort(child);
    throw;
  }
  ncclComm_t child = __atomic_load_n(slot.get(), __ATOMIC_ACQUIRE);
  if (child == nullptr) {
    throw CommError("nccl", "split", rank_, world_,
                    "ncclCommSplit completed without a child communicator (every rank passes a "
                    "color here); the parent communicator is usable");
  }
  std::shared_ptr<NcclComm> out(new NcclComm(child, key, child_world, device_, timeout_));
  std::lock_guard<std::mutex> child_lock(out->mu_);
  try {
    // The child's own initialisation state; on failure settle_locked aborts the child alone.
    out->settle_locked("split", "the child communicator did not finish its initialisation");
  } catch (const TimeoutError& e) {
    throw TimeoutError(
        "nccl", "split", rank_, world_,
        e.cause() + " (the child communicator, which was aborted; the parent is usable)");
  } catch (const CommError& e) {
    throw CommError(
        "nccl", "split", rank_, world_,
        e.cause() + " (the child communicator, which was aborted; the parent is usable)");
  }
  int child_rank = -1;
  if (ncclCommUserRank(child, &child_rank) == ncclSuccess) out->rank_ = child_rank;
  return out;
}

NcclComm::~NcclComm() {
  if (aborted_ || comm_ == nullptr) return;
  CudaDeviceGuard guard(device_);
  if (std::uncaught_exceptions() > 0) {
    // Leaving on an error: finalising would wait for the peers to be done with the
    // communicator, and they may be waiting in a collective this rank will never issue.
    // Aborted, the process exits at once and its launcher ends the others.
    (void)abort_by(comm_, leaving_deadline());
    return;
  }
  // ncclCommFinalize flushes what was issued and waits (through ncclInProgress) for the other
  // ranks to be done with the communicator; bounded, since a peer may be gone.
  ncclResult_t rc = ncclCommFinalize(comm_);
  const auto start = Clock::now();
  for (int polls = 0; rc == ncclSuccess || rc == ncclInProgress; ++polls) {
    ncclResult_t state = ncclSuccess;
    rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess || state != ncclInProgress) {
      rc = rc == ncclSuccess ? state : rc;
      break;
    }
    if (timeout_.count() > 0 && Clock::now() - start > timeout_) {
      rc = ncclInProgress;
      break;
    }
    backoff(polls);
  }
  if (rc == ncclSuccess) {
    ncclCommDestroy(comm_);
  } else {
    ncclCommAbort(comm_);
  }
}

void NcclComm::throw_if_aborted(const char* op) {
  if (aborted_) throw CommError("nccl", op, rank_, world_, cause_);
}

void NcclComm::finish_locked(const char* op, ncclResult_t rc) {
  if (rc == ncclSuccess) return;
  if (rc == ncclInProgress) {
    settle_locked(op, "a peer did not take part (it died, hangs, or issued something else)");
    return;
  }
  throw CommError(
      "nccl", op, rank_, world_,
      fmt::format("NCCL returned {}: {}", ncclGetErrorString(rc), ncclGetLastError(comm_)));
}

void NcclComm::settle_locked(const char* op, const char* late) {
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
    if (rc != ncclSuccess) state = rc;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      const std::string cause =
          fmt::format("NCCL reported {}: {}", ncclGetErrorString(state), ncclGetLastError(comm_));
      abort_locked(cause + "; the communicator was aborted");
      throw CommError("nccl", op, rank_, world_, cause);
    }
    const auto waited = Clock::now() - start;
    if (timeout_.count() > 0 && waited > timeout_) {
      const std::string cause = fmt::format("did not complete within {:.1f} s (the timeout): {}",
                                            std::chrono::duration<double>(waited).count(), late);
      abort_locked(cause + "; the communicator was aborted");
      throw TimeoutError("nccl", op, rank_, world_, cause);
    }
    backoff(polls);
  }
}

void NcclComm::check(const char* op) {
  std::lock_guard<std::mutex> lock(mu_);
  throw_if_aborted(op);
  ncclResult_t state = ncclSuccess;
  FSDP_NCCL_CHECK(ncclCommGetAsyncError(comm_, &state), op, rank_, world_);
  if (state != ncclSuccess && state != ncclInProgress) {
    throw CommError("nccl", op, rank_, world_,
                    fmt::format("asynchronous NCCL error: {}: {}", ncclGetErrorString(state),
                                ncclGetLastError(comm_)));
  }
}

std::string NcclComm::async_error() {
  std::lock_guard<std::mutex> lock(mu_);
  if (aborted_) return "";
  ncclResult_t state = ncclSuccess;
  ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
  if (rc != ncclSuccess) state = rc;
  if (state == ncclSuccess || state == ncclInProgress) return "";
  return fmt::format("asynchronous NCCL error: {}: {}", ncclGetErrorString(state),
                     ncclGetLastError(comm_));
}

bool NcclComm::abort_leaving(const std::string& cause, Clock::time_point deadline) {
  const ncclComm_t doomed = mark_aborted(cause);
  return doomed == nullptr || abort_by(doomed, deadline);
}

bool NcclComm::abort_by(ncclComm_t doomed, Clock::time_point deadline) {
  if (abort_within(doomed, device_, deadline)) return true;
  std::fprintf(stderr,
               "[nccl rank %d/%d] fsdp: ncclCommAbort did not return within %lld s while this "
               "rank was leaving on an error; leaving without it\n",
               rank_, world_, static_cast<long long>(kLeavingAbortLimit.count() / 1000));
  return false;
}

Clock::time_point NcclComm::leaving_deadline() {
  static const Clock::time_point deadline = Clock::now() + kLeavingAbortLimit;
  return deadline;
}

void NcclComm::abort(const std::string& cause) {
  const ncclComm_t doomed = mark_aborted(cause);
  if (doomed == nullptr) return;
  CudaDeviceGuard guard(device_);
  ncclCommAbort(doomed);
}

ncclComm_t NcclComm::mark_aborted(const std::string& cause) {
  std::lock_guard<std::mutex> lock(mu_);
  return mark_aborted_locked(cause);
}

ncclComm_t NcclComm::mark_aborted_locked(const std::string& cause) {
  if (aborted_) return nullptr;
  // The flag and the cause under the lock: nobody is inside an NCCL call on this communicator
  // now, and every later call sees the flag and throws instead of touching the handle.
  cause_ = cause;
  aborted_ = true;
  return comm_;
}

void NcclComm::abort_locked(const std::string& cause) {
  ncclComm_t doomed = mark_aborted_locked(cause);
  if (doomed == nullptr) return;
  CudaDeviceGuard guard(device_);
  ncclCommAbort(doomed);
}

}  // namespace fsdp::detail
