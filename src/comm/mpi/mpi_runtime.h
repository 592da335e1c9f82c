// Internal: MPI initialisation as RAII, and the check that turns MPI error codes into CommError.
#pragma once

#include <mpi.h>

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

 private:
  MpiRuntime() = default;
  bool initialised_here_ = false;
  bool thread_multiple_ = true;
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
