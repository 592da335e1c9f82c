// plan_memory (planner.h): memory per rank, from the runtime's layout and schedule.
#include <algorithm>

#include "fsdp/tools/planner.h"
#include "tools/planner/request.h"

namespace fsdp::plan {

MemoryPlan plan_memory(const PlanRequest& r) {
  detail::check_request(r);
  const Dtypes& d = r.dtypes;
  const int shards = r.layout.shards();
  const bool hybrid = r.layout.replicas > 1;
  const bool passthrough = detail::passthrough(r);
  const auto sizes = detail::sizes_of(r);

  MemoryPlan m;
  for (const auto& s : sizes) m.param_shards += s.rank0 * d.param_bytes;
  m.grad_shards = m.param_shards;
  m.optimizer_states = r.optimizer_states * m.param_shards;

  // Units other than the root (the blocks): the largest sets the buffers' sizes. Blocks that
  // keep their parameters from forward to backward (reshard_after_forward false) hold them
  // all at once; the others one at a time.
  int64_t block_full = 0, block_padded = 0, kept_full = 0;
  for (size_t i = 1; i < sizes.size(); ++i) {
    block_padded = std::max(block_padded, sizes[i].padded);
    if (r.units[i].reshard_after_forward) {
      block_full = std::max(block_full, sizes[i].full);
    } else {
      kept_full += sizes[i].full;
    }
  }
  const int64_t blocks = static_cast<int64_t>(sizes.size()) - 1;
  if (!passthrough) {
    // Full parameters exist from a unit's wait for its gather to its reshard: the root's from
    // its forward to the end of backward, one block's at a time (a prefetched block holds only
    // its gather's buffers until its turn), and every block's that is kept.
    m.gathered_params = (sizes[0].full + kept_full + block_full) * d.compute_bytes;
    const auto set = [&](int64_t padded, int bytes) {
      return collective_buffer_bytes(padded, shards, bytes);
    };
    // In backward, at block i: the gathers prefetched ahead of it and the reductions the
    // schedule keeps in flight (layout.h); with hybrid sharding one more unit's all-reduce,
    // which keeps only its reduced shard. The pool keeps buffers by size and dtype, so with one
    // dtype gathers and reductions share them: the most alive at once.
    const int64_t reduced_shard = block_padded * d.reduce_bytes;
    const int64_t gathers = std::min<int64_t>(blocks, r.gathers_ahead);
    const int64_t reductions = std::min<int64_t>(blocks, kReductionsInFlight);
    int64_t block_sets = 0;
    if (d.compute_bytes == d.reduce_bytes) {
      const int64_t alive = std::min<int64_t>(blocks, r.gathers_ahead + kReductionsInFlight);
      block_sets = set(block_padded, d.reduce_bytes) * alive +
                   (hybrid && blocks > alive ? reduced_shard : 0);
    } else {
      // Gathers and reductions in separate pools: the all-reduce's shard is one more buffer of
      // the reduce dtype once a block beyond those reducing exists.
      block_sets = set(block_padded, d.compute_bytes) * gathers +
                   set(block_padded, d.reduce_bytes) * reductions +
                   (hybrid && blocks > kReductionsInFlight ? reduced_shard : 0);
    }
    // The root gathers once (it keeps its parameters through backward) and reduces last.
    const int64_t root_sets =
        d.compute_bytes == d.reduce_bytes
            ? set(sizes[0].padded, d.reduce_bytes)
            : set(sizes[0].padded, d.compute_bytes) + set(sizes[0].padded, d.reduce_bytes);
    m.comm_buffers = root_sets + block_sets;
  }

  int64_t kept = 0, recompute = 0;
  for (const auto& u : r.units) {
    kept += u.checkpointed ? u.checkpoint_input_bytes : u.activation_bytes;
    if (u.checkpointed) recompute = std::max(recompute, u.activation_bytes);
  }
  m.activations = kept + recompute + r.transient_bytes;
  // Accumulation without sync keeps every unit's full gradient, in the reduce dtype.
  int64_t unsharded_grads = 0;
  if (r.micro_batches > 1 && !r.reduce_every_micro_batch && !passthrough) {
    for (const auto& s : sizes) unsharded_grads += s.full * d.reduce_bytes;
  }
  // Backward starts with every activation alive and no gradient (zero_grad frees them); it
  // ends with the activations freed and every gradient shard present, beside the full
  // gradients of the last unit (the root, the largest) before its reduce-scatter. The step
  // peaks at the larger of the two.
  int64_t largest_full = 0;
  for (const auto& s : sizes) largest_full = std::max(largest_full, s.full);
  const int64_t end_of_backward =
      m.grad_shards + (passthrough ? 0 : largest_full * d.compute_bytes);
  m.total = m.param_shards + m.optimizer_states + m.gathered_params + m.comm_buffers +
            unsharded_grads + std::max(m.activations, end_of_backward);
  return m;
}

}  // namespace fsdp::plan
