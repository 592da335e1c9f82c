// Internal: MPI initialisation as RAII, and the check that turns MPI error codes into CommError.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "fsdp/errors.h"

namespace fsdp::detail {

// Holds MPI initialised. Every MPI group keeps one; the last one out finalises MPI if this
// library initialised it (a program that called MPI_Init itself keeps ownership).
class MpiRuntime {
 public:
  static std::shared_ptr<MpiRuntime> acquire();
  ~MpiRuntime();
  // False when MPI granted less than MPI_THREAD_MULTIPLE; groups then serialise MPI calls.
  bool thread_multiple() const { return thread_multiple_; }

  // A collective timed out: a worker thread is stuck inside MPI, which cannot cancel a
  // collective, so this process can neither free its communicators nor finalise MPI. Prints
  // `reason` to stderr once, then aborts the job (MPI_Abort on MPI_COMM_WORLD, which ends
  // every rank) when the last MPI group is destroyed or after `grace`, whichever is first:
  // the caller gets to report the error before the job goes.
  void abort_job_later(const std::string& reason, std::chrono::milliseconds grace);
  bool broken() const { return broken_.load(); }

 private:
  MpiRuntime() = default;
  bool initialised_here_ = false;
  bool thread_multiple_ = true;
  std::atomic<bool> broken_{false};
};

std::string mpi_error_string(int code);

}  // namespace fsdp::detail

// Calls an MPI function and throws fsdp::CommError naming the op, rank, world and MPI's text.
#define FSDP_MPI_CHECK(call, op, rank, world)                                               \
  do {                                                                                      \
    int fsdp_mpi_rc_ = (call);                                                              \
    if (fsdp_mpi_rc_ != MPI_SUCCESS) {                                                      \
      throw ::fsdp::CommError(                                                              \
          "mpi", op, rank, world,                                                           \
          fmt::format("{} returned {} ({}:{})", #call,                                      \
                      ::fsdp::detail::mpi_error_string(fsdp_mpi_rc_), __FILE__, __LINE__)); \
    }                                                                                       \
  } while (0)
