// Communication hooks of a unit (FSDP2's set_custom_all_gather, set_custom_reduce_scatter and
// set_all_reduce_hook, torch/distributed/fsdp/_fully_shard/_fsdp_api.py), and a quantized
// weight all-gather built on the first (ZeRO++'s qwZ).
//
//   for (auto& layer : model->layers) layer.set_custom_all_gather(fsdp::quantized_all_gather());
//
// A hook replaces one collective of the unit and nothing else: the runtime still packs the flat
// buffers (fsdp/runtime/layout.h), pools them, counts them in MemoryStats, waits on the Work the
// hook returns (timed as exposed communication) and unpacks. A hook must be a collective: every
// rank of the group calls it in the same order, and it must fill the whole output.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "fsdp/comm/process_group.h"
#include "fsdp/comm/work.h"

namespace fsdp {

// A unit's all-gather: `input` is this rank's flat buffer (the compute dtype, n elements) and
// `output` receives every rank's, rank after rank (group.size() * n elements, the same dtype).
// Returns the handle whose wait() makes `output` usable (null: done already). Used for every
// gather of the unit: before forward, before backward, and over the smaller group of
// reshard_after_forward_ranks.
using AllGatherComm =
    std::function<WorkPtr(const at::Tensor& output, const at::Tensor& input, ProcessGroup& group)>;

// A unit's reduce-scatter of its gradients: `input` holds the group.size() ranks' flat
// gradient buffers one after another (the reduce dtype), `output` receives this rank's reduced
// one; `op` is what the runtime would have used (kAvg, or kSum with a divide factor or one
// rank). Returns the handle whose wait() makes `output` usable (null: done already).
using ReduceScatterComm = std::function<WorkPtr(const at::Tensor& output, const at::Tensor& input,
                                                ProcessGroup& group, ReduceOp op)>;

// Runs on the unit's reduced gradient shard (the reduce dtype, the flat layout) after the
// reduce-scatter, or after the all-reduce across replicas with hybrid sharding, and before a
// gradient divide factor divides it and the shard is added into the parameters' grad(): for
// example an all-reduce over a further group. In place; when it returns its result must be
// usable. Not run by backwards that keep gradients unsharded (set_requires_gradient_sync(false))
// nor, with hybrid sharding, by those without the all-reduce (set_requires_all_reduce(false)).
using AllReduceHook = std::function<void(const at::Tensor& reduce_output)>;

// ZeRO++'s quantized weights (qwZ): each rank's flat buffer is split into blocks of
// `block_size` elements, each block stored as int8 with one float32 scale (its largest
// magnitude / 127, rounded to nearest), and the bytes are all-gathered (uint8); every rank then
// dequantizes every block into the compute dtype. Per element 1 + 4 / block_size bytes instead
// of 4 (float32) or 2 (bfloat16). Every rank computes with the same dequantized weights, its own
// shard included, so the ranks stay equal; the shards and the optimizer keep full precision
// (only what the forward and backward read is rounded). Gradients are not quantized.
struct QuantizedAllGatherOptions {
  int64_t block_size = 256;  // a multiple of 4 in [4, 1 << 20]
};
// The hook; InvalidArgument for a block size outside the contract.
AllGatherComm quantized_all_gather(QuantizedAllGatherOptions options = {});
// Bytes one rank sends for `numel` elements through quantized_all_gather(options).
int64_t quantized_all_gather_bytes(int64_t numel, QuantizedAllGatherOptions options = {});

}  // namespace fsdp
