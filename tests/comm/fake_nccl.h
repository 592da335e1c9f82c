// A fake of the parts of NCCL's and the CUDA runtime's C API that NcclComm uses, linked into
// test_nccl_comm_fake in place of libnccl and libcudart, so that the communicator's protocol
// (non-blocking init and split, settling, aborts, the device guard) runs on a machine without a
// GPU. It behaves as NCCL 2.28 does where the protocol depends on it (src/init.cc): a
// non-blocking ncclCommSplit returns ncclInProgress, runs as a job of the *parent* (the parent
// reports ncclInProgress until it ends) and writes the child's handle only when the job ends,
// success or failure; ncclCommGetAsyncError on a null communicator is ncclInvalidArgument
// ("comm argument is NULL").
#pragma once

#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace fsdp::testing::fake_nccl {

// How the next ncclCommSplit goes.
enum class Split {
  kOk,           // the parent's job ends after a few polls; the child settles after a few more
  kRefused,      // ncclCommSplit returns ncclInvalidArgument at once, nothing starts
  kParentFails,  // the parent's job fails (ncclSystemError); the child's handle is written
  kParentHangs,  // the parent's job never ends (a peer that never calls the split)
  kChildFails,   // the parent's job ends; the child reports ncclInternalError
};

struct Comm {
  int rank = 0, nranks = 1;
  std::atomic<ncclResult_t> state{ncclSuccess};
  std::atomic<int> polls_left{0};  // polls before `state` turns into `then`
  ncclResult_t then = ncclSuccess;
  ncclComm_t* pending_child_slot = nullptr;  // written when the parent's job ends
  Comm* pending_child = nullptr;
  std::atomic<bool> aborted{false};
  std::atomic<bool> destroyed{false};
};

struct Stats {
  std::atomic<int> splits{0};
  std::atomic<int> aborts{0};
  std::atomic<int> finalizes{0};
  std::atomic<int> set_device_calls{0};
  std::atomic<bool> split_slot_on_stack{false};  // a slot NCCL writes later lay on a stack
};

// Test controls, reset by reset().
void reset();
void set_next_split(Split how);
Stats& stats();
Comm* as_fake(ncclComm_t comm);
// A communicator made as ncclCommInitRankConfig would (already settled).
ncclComm_t make_comm(int rank, int nranks);
// ncclCommAbort blocks until release_abort() while this is set (checks that nothing waits
// behind an abort in progress).
void hold_aborts(bool hold);
void release_abort();
bool abort_in_progress();
// The fake CUDA runtime: whether `device`'s primary context exists (cuda_primary_context_exists
// reads it) and the calling thread's current device.
void set_primary_context(int device, bool exists);

}  // namespace fsdp::testing::fake_nccl
