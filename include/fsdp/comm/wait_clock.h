// WaitClock: how long the consumers of collectives waited for them (exposed communication),
// summed over waits (Work::wait_timed).
//
// What a wait costs depends on where the result is consumed. On CPU backends the calling thread
// blocks in wait(), so the clock adds that thread's time. On CUDA (NCCL) wait() blocks nothing
// on the host: it makes the caller's stream wait for the collective. The time that matters is how
// long that stream stalled, known only once the device got there: the backend records a pair of
// CUDA events around the stream's wait and hands them to the clock as a Pending measurement,
// read later. Either way seconds() is the same quantity: time the compute could not proceed.
//
// Not thread-safe: one clock belongs to one rank's training thread.
#pragma once

#include <deque>
#include <memory>

namespace fsdp {

class WaitClock {
 public:
  // A measurement the device finishes later (a stream's stall between two events).
  class Pending {
   public:
    virtual ~Pending() = default;
    // Whether seconds() would return at once. Never blocks.
    virtual bool ready() = 0;
    // The measured seconds; blocks until the device has passed the measurement's end. Never
    // throws: a measurement the device cannot report (a failed context) counts 0, and the
    // failure surfaces through the collective's own wait.
    virtual double seconds() = 0;
  };

  WaitClock() = default;
  WaitClock(WaitClock&&) = default;
  WaitClock& operator=(WaitClock&&) = default;

  void add(double seconds) { settled_ += seconds; }
  // Measurements already finished are folded in on the way, so a clock nobody reads holds only
  // the ones the device has not reached yet.
  void add(std::unique_ptr<Pending> pending);

  // The total so far. Blocks until the device has passed every wait added (on CUDA: a stream
  // synchronisation up to the last recorded wait); reads nothing from the device otherwise.
  double seconds() const;
  // The same: the clock reads as a number of seconds (so a `double exposed_seconds` field can be
  // initialised from it).
  operator double() const { return seconds(); }  // NOLINT(google-explicit-constructor)

 private:
  void fold_ready() const;

  mutable double settled_ = 0;
  mutable std::deque<std::unique_ptr<Pending>> pending_;
};

}  // namespace fsdp
