// plan_collectives (planner.h): each collective's calls, bytes and time per step, from the
// unit schedule of fully_shard.h.
#include "fsdp/tools/planner.h"
#include "tools/planner/request.h"

namespace fsdp::plan {

std::vector<CollectivePlan> plan_collectives(const PlanRequest& r) {
  detail::check_request(r);
  const Layout& l = r.layout;
  const int rph = l.ranks_per_host;
  // Tensor parallelism's all-reduces of activations, within each group of tp consecutive ranks.
  CollectivePlan tp{"tp", Op::kAllReduce, l.tp};
  if (l.tp > 1) {
    const bool tp_crosses = rph > 0 && (l.tp > rph || rph % l.tp != 0);
    for (const auto& u : r.units) {
      const int64_t calls =
          r.micro_batches * u.tp_all_reduces * (u.checkpointed ? 3 : 2);  // fwd, bwd, recompute
      tp.calls_per_step += calls;
      tp.bytes_per_step += calls * u.tp_all_reduce_bytes;
      tp.seconds_per_step +=
          calls * r.comm.seconds(Op::kAllReduce, l.tp, u.tp_all_reduce_bytes, tp_crosses);
    }
  }
  if (detail::passthrough(r)) {
    if (l.tp > 1) return {tp};
    return {};
  }
  const Dtypes& d = r.dtypes;
  const int shards = l.shards();
  const bool hybrid = l.replicas > 1;
  const auto sizes = detail::sizes_of(r);
  // A shard group's ranks are tp apart: it spans shards x tp consecutive ranks.
  const int span = shards * l.tp;
  const bool shard_crosses = rph > 0 && (span > rph || rph % span != 0);
  const bool replicate_crosses = rph > 0 && l.world > rph;
  CollectivePlan ag{"shard", Op::kAllGather, shards}, rs{"shard", Op::kReduceScatter, shards},
      ar{"replicate", Op::kAllReduce, l.replicas};
  for (size_t i = 0; i < r.units.size(); ++i) {
    const auto& u = r.units[i];
    if (u.params.empty()) continue;
    const int64_t padded = sizes[i].padded;
    // Forward gathers every unit per micro-batch; backward gathers again those freed after
    // forward; gradients are reduced once per step (or per micro-batch).
    const int64_t gathers = r.micro_batches * (u.reshard_after_forward ? 2 : 1);
    const int64_t reductions = r.reduce_every_micro_batch ? r.micro_batches : 1;
    const int64_t ag_bytes = shards * padded * d.compute_bytes;
    const int64_t rs_bytes = shards * padded * d.reduce_bytes;
    ag.calls_per_step += gathers;
    ag.bytes_per_step += gathers * ag_bytes;
    ag.seconds_per_step +=
        gathers * r.comm.seconds(Op::kAllGather, shards, ag_bytes, shard_crosses);
    rs.calls_per_step += reductions;
    rs.bytes_per_step += reductions * rs_bytes;
    rs.seconds_per_step +=
        reductions * r.comm.seconds(Op::kReduceScatter, shards, rs_bytes, shard_crosses);
    if (hybrid) {
      const int64_t ar_bytes = padded * d.reduce_bytes;
      ar.calls_per_step += reductions;
      ar.bytes_per_step += reductions * ar_bytes;
      ar.seconds_per_step +=
          reductions * r.comm.seconds(Op::kAllReduce, l.replicas, ar_bytes, replicate_crosses);
    }
  }
  std::vector<CollectivePlan> out{ag, rs};
  if (hybrid) out.push_back(ar);
  if (l.tp > 1) out.push_back(tp);
  return out;
}

}  // namespace fsdp::plan
