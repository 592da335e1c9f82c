// The fake NCCL and CUDA runtime of fake_nccl.h: C functions with the real ones' signatures.
#include "fake_nccl.h"

#include <cuda_runtime_api.h>
#include <pthread.h>

#include <cstdint>
#include <set>
#include <thread>

namespace fsdp::testing::fake_nccl {
namespace {

std::mutex mu;  // split scenario, contexts, abort hold
Split next_split = Split::kOk;
std::set<int> contexts;
bool holding = false, released = false, in_abort = false;
std::condition_variable abort_cv;
thread_local int current_device = 0;  // CUDA's default for a thread that never chose one
Stats the_stats;

bool on_this_threads_stack(const void* p) {
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return false;
  void* base = nullptr;
  size_t size = 0;
  pthread_attr_getstack(&attr, &base, &size);
  pthread_attr_destroy(&attr);
  const auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
  return a >= b && a < b + size;
}

// One poll of a communicator's state: counts down, then turns into its final state; a parent
// whose split job ends writes the child's handle then (NCCL's job does on exit).
ncclResult_t poll(Comm* c) {
  if (c->state.load() != ncclInProgress) return c->state.load();
  if (c->polls_left.fetch_sub(1) > 1) return ncclInProgress;
  if (c->pending_child_slot) {
    __atomic_store_n(c->pending_child_slot, reinterpret_cast<ncclComm_t>(c->pending_child),
                     __ATOMIC_RELEASE);
    c->pending_child_slot = nullptr;
  }
  c->state = c->then;
  return c->state.load();
}

}  // namespace

void reset() {
  std::unique_lock<std::mutex> lock(mu);
  next_split = Split::kOk;
  contexts = {0};
  // A test that failed while an abort was held leaves its thread waiting: no longer holding
  // lets it go, and it is waited for, so that it cannot count in a later test's aborts.
  holding = released = false;
  abort_cv.notify_all();
  while (in_abort) {
    lock.unlock();
    std::this_thread::yield();
    lock.lock();
  }
  the_stats.splits = the_stats.aborts = the_stats.finalizes = the_stats.set_device_calls = 0;
  the_stats.split_slot_on_stack = false;
  current_device = 0;
}

void set_next_split(Split how) {
  std::lock_guard<std::mutex> lock(mu);
  next_split = how;
}

Stats& stats() { return the_stats; }

Comm* as_fake(ncclComm_t comm) { return reinterpret_cast<Comm*>(comm); }

ncclComm_t make_comm(int rank, int nranks) {
  auto* c = new Comm;  // freed never: a test's handful of bytes, as NCCL's handles outlive calls
  c->rank = rank;
  c->nranks = nranks;
  return reinterpret_cast<ncclComm_t>(c);
}

void hold_aborts(bool hold) {
  std::lock_guard<std::mutex> lock(mu);
  holding = hold;
  released = false;
}

void release_abort() {
  std::lock_guard<std::mutex> lock(mu);
  released = true;
  abort_cv.notify_all();
}

bool abort_in_progress() {
  std::lock_guard<std::mutex> lock(mu);
  return in_abort;
}

void set_primary_context(int device, bool exists) {
  std::lock_guard<std::mutex> lock(mu);
  if (exists) {
    contexts.insert(device);
  } else {
    contexts.erase(device);
  }
}

}  // namespace fsdp::testing::fake_nccl

namespace fake = fsdp::testing::fake_nccl;

// --- NCCL ----------------------------------------------------------------------------------
extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInProgress:
      return "NCCL operation in progress";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    default:
      return "fake NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t) { return "fake NCCL's last error"; }

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId, int rank,
                                    ncclConfig_t*) {
  *comm = fake::make_comm(rank, nranks);
  auto* c = fake::as_fake(*comm);
  c->state = ncclInProgress;
  c->polls_left = 3;
  c->then = ncclSuccess;
  return ncclInProgress;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t*) {
  (void)color;
  fake::Split how;
  {
    std::lock_guard<std::mutex> lock(fake::mu);
    how = fake::next_split;
  }
  fake::stats().splits++;
  *newcomm = nullptr;  // NCCL clears it first; the handle comes when the parent's job ends
  if (how == fake::Split::kRefused) return ncclInvalidArgument;
  auto* parent = fake::as_fake(comm);
  auto* child = fake::as_fake(fake::make_comm(key, parent->nranks));
  child->state = ncclInProgress;
  child->polls_left = 2;
  child->then = how == fake::Split::kChildFails ? ncclInternalError : ncclSuccess;
  if (fake::on_this_threads_stack(newcomm)) fake::stats().split_slot_on_stack = true;
  parent->pending_child = child;
  parent->pending_child_slot = newcomm;
  parent->state = ncclInProgress;
  parent->polls_left = how == fake::Split::kParentHangs ? 1 << 30 : 3;
  parent->then = how == fake::Split::kParentFails ? ncclSystemError : ncclSuccess;
  return ncclInProgress;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr) return ncclInvalidArgument;  // "comm argument is NULL"
  auto* c = fake::as_fake(comm);
  if (c->destroyed) return ncclInvalidArgument;
  *async_error = fake::poll(c);
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (comm == nullptr) return ncclInvalidArgument;
  *rank = fake::as_fake(comm)->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  std::unique_lock<std::mutex> lock(fake::mu);
  fake::in_abort = true;
  if (fake::holding) fake::abort_cv.wait(lock, [] { return fake::released || !fake::holding; });
  fake::in_abort = false;
  auto* c = fake::as_fake(comm);
  c->aborted = true;
  c->destroyed = true;
  fake::stats().aborts++;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  fake::stats().finalizes++;
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclInvalidArgument;
  fake::as_fake(comm)->destroyed = true;
  return ncclSuccess;
}

// --- the CUDA runtime ----------------------------------------------------------------------
cudaError_t cudaGetDevice(int* device) {
  *device = fake::current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  fake::stats().set_device_calls++;
  fake::current_device = device;
  std::lock_guard<std::mutex> lock(fake::mu);
  fake::contexts.insert(device);  // CUDA 12 and later: setting a device creates its context
  return cudaSuccess;
}

cudaError_t cudaGetLastError() { return cudaSuccess; }

}  // extern "C"

namespace fsdp::detail {

bool cuda_primary_context_exists(int device) {
  std::lock_guard<std::mutex> lock(fake::mu);
  return fake::contexts.count(device) > 0;
}

}  // namespace fsdp::detail
