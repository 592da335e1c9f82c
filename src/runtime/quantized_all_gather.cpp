// ZeRO++'s quantized weight all-gather (qwZ) as an AllGatherComm (fsdp/runtime/comm_hooks.h).
//
// One rank's message: each parameter's elements padded to whole blocks, one after another, as
// int8 ([blocks * block_size] bytes), then one float32 scale per block ([blocks * 4] bytes), in
// one uint8 buffer, so the gather is one collective of about 1 + 4 / block_size bytes per
// element. The block size is a multiple of 4 so that the scales start 4-byte aligned and read
// back as float32 in place.
#include <ATen/ATen.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "fsdp/runtime/comm_hooks.h"
#include "util/check.h"

namespace fsdp {
namespace {

// A parameter's elements in the rank's buffer and where its blocks start in the message.
struct Segment {
  int64_t begin = 0, length = 0;  // in the buffer
  int64_t padded_begin = 0;       // in the padded values (blocks * block elements)
};

struct QuantLayout {
  int64_t numel = 0, blocks = 0, block = 0;
  std::vector<Segment> segments;
  int64_t int8_bytes() const { return blocks * block; }
  int64_t bytes() const { return int8_bytes() + blocks * 4; }
};

// Segments from the parameters' offsets in a buffer of `numel` elements (none: one segment).
QuantLayout quant_layout(int64_t numel, const std::vector<int64_t>& offsets, int64_t block) {
  QuantLayout q;
  q.numel = numel;
  q.block = block;
  std::vector<int64_t> starts;
  for (int64_t o : offsets) {
    if (o >= 0 && o < numel) starts.push_back(o);
  }
  starts.push_back(0);
  std::sort(starts.begin(), starts.end());
  starts.erase(std::unique(starts.begin(), starts.end()), starts.end());
  for (size_t i = 0; i < starts.size(); ++i) {
    const int64_t end = i + 1 < starts.size() ? starts[i + 1] : numel;
    Segment s{starts[i], end - starts[i], q.blocks * block};
    if (s.length == 0) continue;
    q.blocks += (s.length + block - 1) / block;
    q.segments.push_back(s);
  }
  return q;
}

// `x` (numel elements, any floating dtype) into `out` ([bytes] uint8): symmetric per-block int8,
// round to nearest. A block of zeros gets scale 1 (any scale reads back zeros).
void quantize_into(const at::Tensor& x, const QuantLayout& q, const at::Tensor& out) {
  at::NoGradGuard no_grad;
  auto values = at::zeros({q.blocks * q.block}, x.options().dtype(at::kFloat));
  const auto flat = x.reshape(-1);
  for (const auto& s : q.segments) {
    values.narrow(0, s.padded_begin, s.length).copy_(flat.narrow(0, s.begin, s.length));
  }
  auto blocks = values.view({q.blocks, q.block});
  auto scale = blocks.abs().amax(1).div_(127.0f);
  scale.masked_fill_(scale == 0, 1.0f);
  auto ints = blocks.div(scale.unsqueeze(1)).round_().clamp_(-127, 127).to(at::kChar);
  out.narrow(0, 0, q.int8_bytes()).view(at::kChar).copy_(ints.view(-1));
  out.narrow(0, q.int8_bytes(), q.blocks * 4).view(at::kFloat).copy_(scale);
}

// Every rank's message in `gathered` ([world, bytes] uint8) into `output` (world * numel, the
// compute dtype), rank after rank: one rank's float32 values at a time.
void dequantize_into(const at::Tensor& gathered, const QuantLayout& q, int world,
                     const at::Tensor& output) {
  at::NoGradGuard no_grad;
  auto per_rank = gathered.view({world, q.bytes()});
  auto out = output.view({world, q.numel});
  for (int r = 0; r < world; ++r) {
    auto ints = per_rank[r].narrow(0, 0, q.int8_bytes()).view(at::kChar);
    // The scales sit after the ints at a 4-byte aligned offset (block % 4 == 0).
    auto scales = per_rank[r].narrow(0, q.int8_bytes(), q.blocks * 4).view(at::kFloat);
    auto values = ints.view({q.blocks, q.block}).to(at::kFloat).mul_(scales.unsqueeze(1)).view(-1);
    for (const auto& s : q.segments) {
      out[r].narrow(0, s.begin, s.length).copy_(values.narrow(0, s.padded_begin, s.length));
    }
  }
}

void check_block(int64_t block) {
  FSDP_CHECK_ARG(block >= 4 && block <= (int64_t{1} << 20) && block % 4 == 0,
                 "quantized_all_gather: block_size must be a multiple of 4 in [4, 1048576], got {}",
                 block);
}

}  // namespace

int64_t quantized_all_gather_bytes(const std::vector<int64_t>& lengths,
                                   QuantizedAllGatherOptions options) {
  check_block(options.block_size);
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  for (int64_t n : lengths) {
    offsets.push_back(numel);
    numel += n;
  }
  return quant_layout(numel, offsets, options.block_size).bytes();
}

AllGatherComm quantized_all_gather(QuantizedAllGatherOptions options) {
  check_block(options.block_size);
  const int64_t block = options.block_size;
  return [block](const at::Tensor& output, const at::Tensor& input, ProcessGroup& group,
                 const std::vector<int64_t>& offsets) -> WorkPtr {
    FSDP_CHECK_ARG(input.is_floating_point() && output.scalar_type() == input.scalar_type() &&
                       output.numel() == group.size() * input.numel(),
                   "quantized_all_gather: expected a floating input of n elements and an output "
                   "of {} * n of its dtype, got {} ({}) and {} ({})",
                   group.size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                   c10::toString(output.scalar_type()));
    QuantLayout q = quant_layout(input.numel(), offsets, block);
    const auto bytes = input.options().dtype(at::kByte);
    at::Tensor send = at::empty({q.bytes()}, bytes);
    quantize_into(input, q, send);
    at::Tensor gathered = at::empty({group.size() * q.bytes()}, bytes);
    WorkPtr work = group.all_gather(gathered, send);
    // `send` stays alive until the gather completed; the dequantization then frees both.
    return finish_after(std::move(work), output.device(),
                        [gathered, output, q = std::move(q), world = group.size(), send] {
                          dequantize_into(gathered, q, world, output);
                        });
  };
}

}  // namespace fsdp
