// Internal: MPI initialisation as RAII, and the check that turns MPI error codes into CommError.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "fsdp/errors.h"

namespace fsdp::detail {

// Holds MPI initialised. Every MPI group keeps one; the last one out finalises MPI if this
// library initialised it (a program that called MPI_Init itself keeps ownership).
//
// Leaving on an error: MPI_Finalize waits for every rank, so a rank that fails alone (a file it
// cannot write, out of memory) would sit in it while its peers wait out their collective
// timeout (a minute by default) before the job ends. Every rank's last runtime passes a
// barrier of its own (non-blocking, on a private communicator) before MPI_Finalize. A rank
// whose last group goes while an exception propagates (std::uncaught_exceptions, counted per
// thread) waits there at most kLeaveTogether: when every rank arrives (an error every rank
// raised, such as an agree_on verdict, or the others done) MPI is finalised as usual; else
// this process leaves MPI unfinalised, which ends the job when it exits: Open MPI's mpirun does
// that by itself; under any other launcher (or with FSDP_MPI_ABORT_AT_EXIT=1) an exit handler
// calls MPI_Abort, after the program has reported its error. MPI cannot be used again in that
// process. A program that initialised MPI itself keeps all of this to itself.
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

  // How long a rank leaving on an error waits for the others to be leaving too.
  static constexpr std::chrono::milliseconds kLeaveTogether{3000};

 private:
  MpiRuntime() = default;
  // True when every rank reached the leave-together barrier within `wait` (none: as long as
  // it takes).
  bool every_rank_leaves(std::optional<std::chrono::milliseconds> wait);

  bool initialised_here_ = false;
  // A private duplicate of MPI_COMM_WORLD for the leave-together barrier alone, so that it can
  // never match a collective of a group (made where MPI is initialised here).
  MPI_Comm leave_comm_ = MPI_COMM_NULL;
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
