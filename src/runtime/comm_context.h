// Internal: what the units of one tree share for their communication (FSDP2's FSDPCommContext):
// the pool their large buffers come from, the byte counters behind MemoryStats, the clock of
// exposed communication behind CommStats, and the gradient reductions in flight with the rule
// of how many may stay so (fsdp/runtime/layout.h). Every ParamGroup points to its tree's
// context; until the root's lazy init a unit has one of its own. Only the owning rank's thread
// touches it.
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
  // A reduction just issued: older ones finish so that at most kReductionsInFlight stay alive;
  // with hybrid sharding the one before the newest moves on to its all-reduce across replicas
  // instead of finishing.
  void track(std::shared_ptr<Reduction> reduction);
  // Finishes every reduction in flight (the end of a backward, a failed step).
  void finish_reductions();

  // --- what MemoryStats and CommStats read ---
  int64_t full_bytes() const { return full_bytes_; }
  int64_t peak_full_bytes() const { return peak_full_bytes_; }
  int64_t comm_bytes() const { return comm_bytes_; }
  int64_t peak_comm_bytes() const { return peak_comm_bytes_; }
  int64_t cached_bytes() const { return pool_->pooled_bytes(); }
  // Time the compute spent held up by collectives: collectives are waited with
  // wait_timed(exposed()) (fsdp/comm/wait_clock.h).
  WaitClock& exposed() { return exposed_; }
  const WaitClock& exposed() const { return exposed_; }

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
