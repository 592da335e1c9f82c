// float8_all_gather (fsdp/ops/float8_all_gather.h).
//
// One rank's message, one uint8 buffer: the parameters kept in the compute dtype first, packed
// one after another (so they start at byte 0 and read back in place), then the float8 ones,
// one byte per element, padded to 8 bytes so that every rank's message starts aligned in the
// gathered buffer.
#include "fsdp/ops/float8_all_gather.h"

#include <memory>
#include <utility>

#include "fsdp/ops/float8.h"
#include "ops/float8_cast.h"
#include "util/check.h"

namespace fsdp::ops {
namespace {

struct Segment {
  int64_t begin = 0, length = 0;  // in the rank's buffer (elements)
  int64_t packed = 0;             // in its part of the message (elements of that part)
  int64_t scale_index = -1;       // float8 parameters: which scale
};

struct Float8Layout {
  int64_t numel = 0, element_size = 0;
  int64_t hp_elements = 0, f8_elements = 0;
  std::vector<Segment> hp, f8;
  int64_t hp_bytes() const { return hp_elements * element_size; }
  int64_t bytes() const { return (hp_bytes() + f8_elements + 7) / 8 * 8; }
};

// The parameters' segments from their offsets (every parameter in the buffer, ascending).
Float8Layout layout_of(int64_t numel, const std::vector<int64_t>& offsets,
                       const std::vector<bool>& float8, int64_t element_size) {
  FSDP_CHECK_ARG(offsets.size() == float8.size(),
                 "float8_all_gather: the unit has {} parameters, the float8 mask names {}",
                 offsets.size(), float8.size());
  Float8Layout l;
  l.numel = numel;
  l.element_size = element_size;
  for (size_t i = 0; i < offsets.size(); ++i) {
    FSDP_CHECK_ARG(
        offsets[i] >= 0 && offsets[i] <= numel && (i == 0 || offsets[i] >= offsets[i - 1]),
        "float8_all_gather: parameter {}'s offset {} is not in the buffer of {} "
        "elements in order",
        i, offsets[i], numel);
    const int64_t end = i + 1 < offsets.size() ? offsets[i + 1] : numel;
    Segment s{offsets[i], end - offsets[i], 0, -1};
    if (float8[i]) {
      s.packed = l.f8_elements;
      s.scale_index = static_cast<int64_t>(l.f8.size());
      l.f8_elements += s.length;
      l.f8.push_back(s);
    } else {
      s.packed = l.hp_elements;
      l.hp_elements += s.length;
      l.hp.push_back(s);
    }
  }
  return l;
}

// Every rank's message in `gathered` ([world, bytes]) into `output` (world * numel elements of
// the compute dtype), rank after rank; the float8 values divided by their scales.
void unpack_into(const at::Tensor& gathered, const Float8Layout& l, const at::Tensor& scales,
                 int world, const at::Tensor& output) {
  at::NoGradGuard no_grad;
  auto per_rank = gathered.view({world, l.bytes()});
  auto out = output.view({world, l.numel});
  for (int r = 0; r < world; ++r) {
    auto hp = per_rank[r].narrow(0, 0, l.hp_bytes()).view(output.scalar_type());
    for (const auto& s : l.hp) {
      out[r].narrow(0, s.begin, s.length).copy_(hp.narrow(0, s.packed, s.length));
    }
    auto f8 = per_rank[r].narrow(0, l.hp_bytes(), l.f8_elements).view(at::kFloat8_e4m3fn);
    for (const auto& s : l.f8) {
      // torchao's Float8 tensor to high precision: float32 / scale, then the compute dtype.
      out[r]
          .narrow(0, s.begin, s.length)
          .copy_(f8.narrow(0, s.packed, s.length).to(at::kFloat) / scales[s.scale_index]);
    }
  }
}

// Each float8 parameter's scale over the whole weight: the largest magnitude of this rank's
// shard (its padding is zeros), the ranks' gathered, their maximum, float8.h's scale.
at::Tensor agreed_scales(const at::Tensor& input, const Float8Layout& l, ProcessGroup& group) {
  at::NoGradGuard no_grad;
  const auto k = static_cast<int64_t>(l.f8.size());
  // The padding of a shard is zeros; a parameter without elements here contributes 0.
  const auto flat = input.reshape(-1);
  std::vector<at::Tensor> maxima;
  for (const auto& s : l.f8) {
    maxima.push_back(s.length > 0
                         ? detail::abs_max(flat.narrow(0, s.begin, s.length)).to(at::kFloat)
                         : at::zeros({}, input.options().dtype(at::kFloat)));
  }
  const auto amax = at::stack(maxima);
  auto all = at::empty({group.size() * k}, amax.options());
  group.all_gather(all, amax)->wait();
  return float8_scale(all.view({group.size(), k}).amax(0), at::kFloat8_e4m3fn);
}

}  // namespace

int64_t float8_all_gather_bytes(const std::vector<int64_t>& lengths,
                                const std::vector<bool>& float8, int64_t element_size) {
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  for (int64_t n : lengths) {
    offsets.push_back(numel);
    numel += n;
  }
  return layout_of(numel, offsets, float8, element_size).bytes();
}

AllGatherComm float8_all_gather(Float8AllGatherOptions options) {
  bool any = false;
  for (bool f : options.float8) any = any || f;
  FSDP_CHECK_ARG(any, "float8_all_gather: no parameter of the unit is marked float8");
  auto o = std::make_shared<Float8AllGatherOptions>(std::move(options));
  return [o](const at::Tensor& output, const at::Tensor& input, ProcessGroup& group,
             const std::vector<int64_t>& offsets) -> WorkPtr {
    FSDP_CHECK_ARG(input.is_floating_point() && output.scalar_type() == input.scalar_type() &&
                       output.numel() == group.size() * input.numel(),
                   "float8_all_gather: expected a floating input of n elements and an output of "
                   "{} * n of its dtype, got {} ({}) and {} ({})",
                   group.size(), input.numel(), c10::toString(input.scalar_type()), output.numel(),
                   c10::toString(output.scalar_type()));
    auto l = layout_of(input.numel(), offsets, o->float8, input.element_size());
    auto scales = agreed_scales(input, l, group);
    if (o->on_scale) {
      for (size_t i = 0, j = 0; i < o->float8.size(); ++i) {
        if (o->float8[i]) o->on_scale(i, scales[static_cast<int64_t>(j++)]);
      }
    }
    const auto bytes = input.options().dtype(at::kByte);
    auto send = at::empty({l.bytes()}, bytes);
    const int64_t used = l.hp_bytes() + l.f8_elements;
    send.narrow(0, used, l.bytes() - used).zero_();  // the padding to 8 bytes
    {
      at::NoGradGuard no_grad;
      const auto flat = input.reshape(-1);
      auto hp = send.narrow(0, 0, l.hp_bytes()).view(input.scalar_type());
      for (const auto& s : l.hp) {
        hp.narrow(0, s.packed, s.length).copy_(flat.narrow(0, s.begin, s.length));
      }
      auto f8 = send.narrow(0, l.hp_bytes(), l.f8_elements).view(at::kFloat8_e4m3fn);
      for (const auto& s : l.f8) {
        f8.narrow(0, s.packed, s.length)
            .copy_(to_float8(flat.narrow(0, s.begin, s.length), at::kFloat8_e4m3fn,
                             scales[s.scale_index])
                       .data);
      }
    }
    auto gathered = at::empty({group.size() * l.bytes()}, bytes);
    WorkPtr work = group.all_gather(gathered, send);
    // `send` stays alive until the gather completed; the unpacking then frees both.
    return finish_after(std::move(work), output.device(),
                        [gathered, output, scales, l = std::move(l), world = group.size(), send] {
                          unpack_into(gathered, l, scales, world, output);
                        });
  };
}

}  // namespace fsdp::ops
