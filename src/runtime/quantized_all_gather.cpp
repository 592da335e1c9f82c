// ZeRO++'s quantized weight all-gather (qwZ) as an AllGatherComm (fsdp/runtime/comm_hooks.h).
//
// One rank's message: its n elements padded to whole blocks, as int8 ([blocks * block_size]
// bytes), then one float32 scale per block ([blocks * 4] bytes), in one uint8 buffer, so the
// gather is one collective of 1 + 4 / block_size bytes per element. The block size is a
// multiple of 4 so that the scales start 4-byte aligned and read back as float32 in place.
#include <ATen/ATen.h>

#include <memory>
#include <utility>

#include "fsdp/runtime/comm_hooks.h"
#include "util/check.h"

namespace fsdp {
namespace {

struct QuantLayout {
  int64_t numel = 0, blocks = 0, block = 0;
  int64_t int8_bytes() const { return blocks * block; }
  int64_t bytes() const { return int8_bytes() + blocks * 4; }
};

QuantLayout quant_layout(int64_t numel, int64_t block) {
  QuantLayout q;
  q.numel = numel;
  q.block = block;
  q.blocks = (numel + block - 1) / block;
  return q;
}

// `x` (numel elements, any floating dtype) into `out` ([bytes] uint8): symmetric per-block int8,
// round to nearest. A block of zeros gets scale 1 (any scale reads back zeros).
void quantize_into(const at::Tensor& x, const QuantLayout& q, const at::Tensor& out) {
  at::NoGradGuard no_grad;
  auto values = at::zeros({q.blocks * q.block}, x.options().dtype(at::kFloat));
  values.narrow(0, 0, q.numel).copy_(x.reshape(-1));
  auto blocks = values.view({q.blocks, q.block});
  auto scale = blocks.abs().amax(1).div_(127.0f);
  scale.masked_fill_(scale == 0, 1.0f);
  auto ints = blocks.div(scale.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar);
  out.narrow(0, 0, q.int8_bytes()).view(at::kChar).copy_(ints.view(-1));
  out.narrow(0, q.int8_bytes(), q.blocks * 4).view(at::kFloat).copy_(scale);
}

// Every rank's message in `gathered` ([world, bytes] uint8) into `output` (world * numel, the
// compute dtype), rank after rank.
void dequantize_into(const at::Tensor& gathered, const QuantLayout& q, int world,
                     const at::Tensor& output) {
  at::NoGradGuard no_grad;
  auto per_rank = gathered.view({world, q.bytes()});
  auto ints = per_rank.narrow(1, 0, q.int8_bytes()).view(at::kChar);
  // The scales of each rank sit after its ints: a strided slice; made contiguous (small) so the
  // float32 view is of aligned, dense bytes.
  auto scales = per_rank.narrow(1, q.int8_bytes(), q.blocks * 4)
                    .contiguous()
                    .view(at::kFloat);  // [world, blocks]
  auto values = ints.reshape({world, q.blocks, q.block})
                    .to(at::kFloat)
                    .mul_(scales.unsqueeze(2))
                    .view({world, q.blocks * q.block});
  output.view({world, q.numel}).copy_(values.narrow(1, 0, q.numel));
}

// The gather of the quantized bytes; wait() then dequantizes into the caller's output.
class DequantizeWork final : public Work {
 public:
  DequantizeWork(WorkPtr gather, at::Tensor gathered, at::Tensor output, QuantLayout q, int world,
                 at::Tensor send)
      : gather_(std::move(gather)),
        gathered_(std::move(gathered)),
        output_(std::move(output)),
        send_(std::move(send)),
        q_(q),
        world_(world) {}

  bool is_completed() override { return done_ || (gather_ && gather_->is_completed()); }
  void wait() override {
    if (done_) return;
    if (gather_) gather_->wait();
    finish();
  }
  // Timed as the gather's wait; the dequantization is the caller's compute.
  void wait_timed(WaitClock& clock) override {
    if (done_) return;
    if (gather_) gather_->wait_timed(clock);
    finish();
  }

 private:
  void finish() {
    gather_.reset();
    dequantize_into(gathered_, q_, world_, output_);
    gathered_ = at::Tensor();
    send_ = at::Tensor();
    output_ = at::Tensor();
    done_ = true;
  }

  WorkPtr gather_;
  at::Tensor gathered_, output_, send_;  // send_: alive until the gather completed
  QuantLayout q_;
  int world_;
  bool done_ = false;
};

void check_block(int64_t block) {
  FSDP_CHECK_ARG(block >= 4 && block <= (int64_t{1} << 20) && block % 4 == 0,
                 "quantized_all_gather: block_size must be a multiple of 4 in [4, 1048576], got {}",
                 block);
}

}  // namespace

int64_t quantized_all_gather_bytes(int64_t numel, QuantizedAllGatherOptions options) {
  check_block(options.block_size);
  return quant_layout(numel, options.block_size).bytes();
}

AllGatherComm quantized_all_gather(QuantizedAllGatherOptions options) {
  check_block(options.block_size);
  const int64_t block = options.block_size;
  return [block](const at::Tensor& output, const at::Tensor& input,
                 ProcessGroup& group) -> WorkPtr {
    FSDP_CHECK_ARG(input.is_floating_point() && output.scalar_type() == input.scalar_type() &&
                       output.numel() == group.size() * input.numel(),
                   "quantized_all_gather: expected a floating input of n elements and an output "
                   "of {} * n of its dtype, got {} ({}) and {} ({})",
                   group.size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                   c10::toString(output.scalar_type()));
    const QuantLayout q = quant_layout(input.numel(), block);
    const auto bytes = input.options().dtype(at::kByte);
    at::Tensor send = at::empty({q.bytes()}, bytes);
    quantize_into(input, q, send);
    at::Tensor gathered = at::empty({group.size() * q.bytes()}, bytes);
    WorkPtr work = group.all_gather(gathered, send);
    return std::make_shared<DequantizeWork>(std::move(work), std::move(gathered), output, q,
                                            group.size(), std::move(send));
  };
}

}  // namespace fsdp
