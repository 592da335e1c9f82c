// Communication hooks of a unit (FSDP2's set_custom_all_gather, set_custom_reduce_scatter and
// set_all_reduce_hook, torch/distributed/fsdp/_fully_shard/_fsdp_api.py), and a quantized
// weight all-gather built on the first (ZeRO++'s qwZ).
//
//   for (auto& layer : model->layers) layer.set_custom_all_gather(fsdp::quantized_all_gather());
//
// A hook replaces one collective of the unit and nothing else: the runtime still packs the flat
// buffers (fsdp/runtime/layout.h), pools them, counts them in MemoryStats, waits on the Work the
// hook returns (timed as exposed communication) and unpacks. Temporaries a hook makes itself are
// its own (not in MemoryStats). A hook must be a collective: every rank of the group calls it in
// the same order, and it must fill the whole output. On a GPU, the runtime issues it and waits
// on its Work on the same (current) stream.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/comm/work.h"

namespace fsdp {

// A unit's all-gather: `input` is this rank's flat buffer (the compute dtype, n elements) and
// `output` receives every rank's, rank after rank (group.size() * n elements, the same dtype).
// `offsets`: where each parameter's elements start in `input` (ascending; FSDP2's AllGather is
// not told, ours is, so that a hook may treat parameters apart, as a quantizer's blocks must).
// Returns the handle whose wait() makes `output` usable (null: done already). Used for the
// gathers of the shards before forward and before backward; the regather over the smaller
// group of reshard_after_forward_ranks moves the forward's values with the group's own.
using AllGatherComm =
    std::function<WorkPtr(const at::Tensor& output, const at::Tensor& input, ProcessGroup& group,
                          const std::vector<int64_t>& offsets)>;

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

// For hooks that compute after their collective (a dequantization): the Work whose completion
// runs `finish` once, after `collective` completed (is_completed() runs it too once the
// collective has finished; its time is the caller's compute, not the wait's), queued on the
// stream current on `device` when this is made, whichever thread completes it, so that the
// runtime, which waits on that stream, is ordered after it. `finish` is dropped after it runs
// (the buffers it holds are freed then).
WorkPtr finish_after(WorkPtr collective, at::Device device, std::function<void()> finish);

// ZeRO++'s quantized weights (qwZ): each parameter's part of a rank's flat buffer is split into
// blocks of `block_size` elements (a block never spans two parameters, so a norm's weights near
// 1 do not round a bias near 0 away), each block stored as int8 with one float32 scale (its
// largest magnitude / 127, rounded to nearest), and the bytes are all-gathered (uint8); every
// rank then dequantizes every block into the compute dtype. Per element about 1 + 4 /
// block_size bytes (plus each parameter's last block's padding) instead of 4 (float32) or 2
// (bfloat16). Every rank computes with the same dequantized weights, its own shard included, so
// the ranks stay equal; the shards and the optimizer keep full precision (only what the forward
// and backward read is rounded). Gradients are not quantized. Its temporaries: a float32 copy
// of the rank's buffer, the quantized bytes of every rank, and one rank's float32 values at a
// time while dequantizing.
struct QuantizedAllGatherOptions {
  int64_t block_size = 256;  // a multiple of 4 in [4, 1 << 20]
};
// The hook; InvalidArgument for a block size outside the contract.
AllGatherComm quantized_all_gather(QuantizedAllGatherOptions options = {});
// Bytes one rank sends through quantized_all_gather(options) for parameters (parts of its
// buffer) of these element counts.
int64_t quantized_all_gather_bytes(const std::vector<int64_t>& lengths,
                                   QuantizedAllGatherOptions options = {});

}  // namespace fsdp
