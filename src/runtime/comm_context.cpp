#include "runtime/comm_context.h"

#include "fsdp/runtime/layout.h"
#include "runtime/reduce.h"

namespace fsdp::detail {

at::Tensor CommContext::take_buffer(int64_t numel, const at::TensorOptions& options) {
  at::Tensor t = pool_->take(numel, options);
  add(comm_bytes_, peak_comm_bytes_, static_cast<int64_t>(t.nbytes()));
  return t;
}

void CommContext::give_buffer(at::Tensor buffer) {
  if (!buffer.defined()) return;
  add(comm_bytes_, peak_comm_bytes_, -static_cast<int64_t>(buffer.nbytes()));
  pool_->give(std::move(buffer));
}

at::DataPtr CommContext::take_full_bytes(int64_t nbytes, c10::Device device,
                                         at::Allocator* fallback) {
  at::DataPtr bytes = pool_->take_bytes(nbytes, device, fallback);
  add(full_bytes_, peak_full_bytes_, nbytes);  // once they exist (an allocation may throw)
  return bytes;
}

void CommContext::track(std::shared_ptr<Reduction> reduction) {
  // One reduce-scatter may run while the next unit's backward computes; older ones are waited
  // for. With hybrid sharding the previous unit's all-reduce across replicas may run as well
  // (on the replicate group, beside this reduce-scatter on the shard group): the unit before
  // the newest moves on to its all-reduce instead of finishing (returning its reduce-scatter's
  // input to the pool), and older ones finish. So the gradient buffers of at most
  // kReductionsInFlight units are alive at once, and with hybrid sharding a third unit's
  // reduced shard.
  in_flight_.push_back(std::move(reduction));
  while (in_flight_.size() > kReductionsInFlight - 1) {
    Reduction& oldest = *in_flight_.front();
    if (in_flight_.size() == kReductionsInFlight && oldest.reduce_scatter_pending() &&
        oldest.hybrid()) {
      oldest.start_all_reduce();
      break;
    }
    oldest.finish();
    in_flight_.pop_front();
  }
}

void CommContext::finish_reductions() {
  // Oldest first: the order every rank issued them in.
  for (auto& r : in_flight_) r->finish();
  in_flight_.clear();
}

}  // namespace fsdp::detail
