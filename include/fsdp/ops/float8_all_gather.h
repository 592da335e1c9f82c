// A unit's all-gather with its float8 Linears' weights cast to float8 first (torchao's
// enable_fsdp_float8_all_gather under FSDP2): one byte per element of those weights on the wire
// instead of two (bf16) or four (fp32); the unit's other parameters (norms, biases, Linears kept
// out of float8) go as they are. As an AllGatherComm (fsdp/runtime/comm_hooks.h):
//
//   layer.set_custom_all_gather(fsdp::ops::float8_all_gather({mask, on_scale}));
//
// or llama::use_float8_all_gather(layer) for a Llama decoder layer.
//
// Each float8 weight is cast with the whole weight's scale (float8.h's tensorwise scale of its
// largest magnitude over every rank's shard, agreed by an all-gather of one float per weight
// before the cast), so the gathered float8 values are those a cast of the whole weight gives;
// every rank then writes their dequantization (value / scale) into the unit's full parameters
// and reports the scale through `on_scale`, which float8_linear's weight_scale takes: the
// forward's GEMM then sees exactly the float8 weight it would have cast itself. So training
// with it gives the same numbers as float8 without it, ours or torchao's, at any world size:
// only the bytes moved change. Gradients and the shards are not touched. It casts the values
// the forward computes with (under bf16 mixed precision, the bf16 copy of the shard), where
// torchao's float8 all-gather casts the float32 master shard: the same in fp32 (measured equal
// under FSDP2), a slightly different rounding under bf16 mixed precision.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "fsdp/runtime/comm_hooks.h"

namespace fsdp::ops {

struct Float8AllGatherOptions {
  // Per parameter of the unit, in its order (FSDPModule::parameters()): true for a weight its
  // forward casts to float8 (e4m3). The hook refuses a unit whose parameter count differs.
  std::vector<bool> float8;
  // Called on every rank at each gather, before the gather's bytes are sent, with the index of
  // each float8 parameter and the scale (float32, one element, on the input's device) it was
  // cast with; the same on every rank.
  std::function<void(size_t index, const at::Tensor& scale)> on_scale;
};

// The hook; InvalidArgument when no parameter is marked.
AllGatherComm float8_all_gather(Float8AllGatherOptions options);

// Bytes one rank sends through float8_all_gather for parameters (parts of its buffer) of these
// element counts, marked as in `float8`, the others of `element_size` bytes each (the message is
// padded to a multiple of 8 bytes); the scales' gather adds 4 bytes per marked parameter.
int64_t float8_all_gather_bytes(const std::vector<int64_t>& lengths,
                                const std::vector<bool>& float8, int64_t element_size);

}  // namespace fsdp::ops
