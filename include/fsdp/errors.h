// Typed errors of the fsdp library.
//
// Contract: the library never terminates the process on a user-reachable path. Bad input is
// reported as InvalidArgument before any data is sent; engine failures (MPI, NCCL, CUDA, Gloo)
// become CommError naming the backend, operation, rank and world size and the engine's own text.
#pragma once

#include <stdexcept>
#include <string>

namespace fsdp {

// Base of every exception thrown by the library.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A caller passed something the API cannot accept (shape, dtype, device, numel, flag).
// Thrown at the public boundary, before any communication starts.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A file's content is not what its format promises (a malformed safetensors header, offsets
// outside the file, a truncated file). The message names the file and the entry.
class FormatError : public Error {
 public:
  using Error::Error;
};

// The launch environment (RANK, WORLD_SIZE, MASTER_ADDR, ...) is missing or malformed.
class LaunchError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written (a path that cannot be created, a full disk, a rename that
// fails); the message names the path and the system's reason.
class IoError : public Error {
 public:
  using Error::Error;
};

// A checkpoint, a Hugging Face directory or an export could not be written or read; the message
// names the rank, file and tensor. (Declared here, below every layer that agrees on one:
// fsdp/checkpoint/checkpoint.h has always provided it.)
class CheckpointError : public Error {
 public:
  using Error::Error;
};

// A backend was asked for an operation or dtype it does not implement.
class UnsupportedError : public Error {
 public:
  using Error::Error;
};

// A communication engine failed. Carries where it happened so a multi-rank log is readable.
class CommError : public Error {
 public:
  // what(): "[<backend> rank <rank>/<world_size>] <op> failed: <cause>".
  CommError(std::string backend, std::string op, int rank, int world_size, std::string cause);

  const std::string& backend() const { return backend_; }
  const std::string& op() const { return op_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& cause() const { return cause_; }

 private:
  std::string backend_;
  std::string op_;
  int rank_;
  int world_size_;
  std::string cause_;
};

// A peer did not arrive at a collective within the group's timeout (a dead or stuck rank).
class TimeoutError : public CommError {
 public:
  using CommError::CommError;
};

}  // namespace fsdp
