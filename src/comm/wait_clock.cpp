#include "fsdp/comm/wait_clock.h"

namespace fsdp {

void WaitClock::add(std::unique_ptr<Pending> pending) {
  fold_ready();
  pending_.push_back(std::move(pending));
}

void WaitClock::fold_ready() const {
  // In recording order: the device reaches them in that order on one stream.
  while (!pending_.empty() && pending_.front()->ready()) {
    settled_ += pending_.front()->seconds();
    pending_.pop_front();
  }
}

double WaitClock::seconds() const {
  for (auto& p : pending_) settled_ += p->seconds();
  pending_.clear();
  return settled_;
}

}  // namespace fsdp
