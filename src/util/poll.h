// Internal: bounded waiting for a condition another agent makes true (a device stream that
// drains, a peer that answers), for the places that must not wait forever, such as a
// destructor that would otherwise synchronise with a stuck stream.
#pragma once

#include <chrono>
#include <functional>
#include <thread>

namespace fsdp::detail {

// Polls `done` until it returns true (then true) or `timeout` has passed (then false); a
// timeout of zero or less waits without bound, as the caller's "no timeout" means.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                       std::chrono::microseconds poll = std::chrono::microseconds(500)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (timeout.count() > 0 && std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(poll);
  }
  return true;
}

}  // namespace fsdp::detail
