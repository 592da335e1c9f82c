// Internal: what the units of one tree share for their communication (FSDP2's FSDPCommContext):
// the pool their large buffers come from, the byte counters behind MemoryStats, the clock of
// exposed communication behind CommStats, and the queue of gradient reductions in flight (which
// the reduce code drives: reduce.h's track_reduction and finish_reductions, with the rule of how
// many may stay in flight, fsdp/runtime/layout.h). The context calls nothing above it: a
// Reduction uses the context (its buffers, its clock), never the other way round. Every
// ParamGroup points to its tree's context; until the root's lazy init a unit has one of its own.
// Only the owning rank's thread touches it.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>

#include "fsdp/comm/wait_clock.h"
#include "runtime/buffer_pool.h"

namespace fsdp::detail {

class Reduction;

class CommContext {
 public:
  // --- buffers of collectives: from the pool, counted while alive ---
  // A buffer of `numel` elements (contents undefined).
  at::Tensor take_buffer(int64_t numel, const at::TensorOptions& options);
  // Hands a buffer from take_buffer back (it must have no other users); undefined: nothing.
  void give_buffer(at::Tensor buffer);

  // --- full parameters' storage bytes: from the pool, counted while alive ---
  at::DataPtr take_full_bytes(int64_t nbytes, c10::Device device, at::Allocator* fallback);
  void release_full_bytes(int64_t nbytes) { add(full_bytes_, peak_full_bytes_, -nbytes); }

  // --- gradient reductions in flight (FSDP2 keeps one reduce-scatter in flight) ---
  // Oldest first (the order every rank issued them in). Held here, one queue per tree; added
  // to and finished only by reduce.h (track_reduction, finish_reductions).
  std::deque<std::shared_ptr<Reduction>>& reductions_in_flight() { return in_flight_; }

  // --- what MemoryStats and CommStats read ---
  int64_t full_bytes() const { return full_bytes_; }
  int64_t peak_full_bytes() const { return peak_full_bytes_; }
  int64_t comm_bytes() const { return comm_bytes_; }
  int64_t peak_comm_bytes() const { return peak_comm_bytes_; }
  int64_t cached_bytes() const { return pool_->pooled_bytes(); }
  // Time the compute spent held up by collectives: collectives are waited with
  // wait_timed(exposed()) (fsdp/comm/wait_clock.h).
  WaitClock& exposed() { return exposed_; }

 private:
  static void add(int64_t& now, int64_t& peak, int64_t n) {
    now += n;
    peak = std::max(peak, now);
  }

  std::shared_ptr<BufferPool> pool_ = std::make_shared<BufferPool>();
  int64_t full_bytes_ = 0, peak_full_bytes_ = 0;
  int64_t comm_bytes_ = 0, peak_comm_bytes_ = 0;
  WaitClock exposed_;
  std::deque<std::shared_ptr<Reduction>> in_flight_;  // oldest first
};

}  // namespace fsdp::detail
