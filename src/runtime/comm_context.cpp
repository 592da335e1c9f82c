#include "runtime/comm_context.h"

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

}  // namespace fsdp::detail
