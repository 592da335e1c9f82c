// make_plan (planner.h): the runtime's sharding arithmetic and unit schedule, counted ahead.
#include "fsdp/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "fsdp/sharding.h"

namespace fsdp::plan {
namespace {

// Sizes of one unit under the layout (elements unless said otherwise).
struct UnitSizes {
  int64_t full = 0;    // every parameter's full elements
  int64_t padded = 0;  // elements each rank contributes to the unit's flat buffers
  int64_t rows0 = 0;   // elements of rank 0's shards (the largest)
};

UnitSizes sizes_of(const UnitSpec& u, int shards) {
  UnitSizes s;
  for (const auto& p : u.params) {
    const auto r = shard_range(p.dim0, shards, 0);
    s.full += p.dim0 * p.row_numel;
    s.padded += r.rows_per_rank * p.row_numel;
    s.rows0 += r.rows() * p.row_numel;
  }
  return s;
}

double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }

void check_request(const PlanRequest& r) {
  const Layout& l = r.layout;
  FSDP_CHECK_ARG(!r.units.empty(), "plan: the model has no units");
  FSDP_CHECK_ARG(l.world >= 1, "plan: the world must have at least 1 rank, got {}", l.world);
  FSDP_CHECK_ARG(l.replicas >= 1 && l.world % l.replicas == 0,
                 "plan: {} replicas do not divide a world of {} ranks", l.replicas, l.world);
  FSDP_CHECK_ARG(
      l.ranks_per_host >= 0 && (l.ranks_per_host == 0 || l.world % l.ranks_per_host == 0),
      "plan: {} ranks per host do not divide a world of {} ranks", l.ranks_per_host, l.world);
  FSDP_CHECK_ARG(r.micro_batches >= 1, "plan: micro_batches must be >= 1, got {}", r.micro_batches);
  for (int b : {r.dtypes.param_bytes, r.dtypes.compute_bytes, r.dtypes.reduce_bytes}) {
    FSDP_CHECK_ARG(b == 2 || b == 4 || b == 8, "plan: dtype sizes must be 2, 4 or 8 bytes, got {}",
                   b);
  }
}

}  // namespace

Plan make_plan(const PlanRequest& r) {
  check_request(r);
  const Layout& l = r.layout;
  const Dtypes& d = r.dtypes;
  const int shards = l.shards();
  const bool hybrid = l.replicas > 1;
  // One rank holding everything in its own dtype moves nothing (ParamGroup's passthrough).
  const bool passthrough =
      shards == 1 && !hybrid && d.compute_bytes == d.param_bytes && d.reduce_bytes == d.param_bytes;

  Plan plan;
  MemoryPlan& m = plan.memory;
  std::vector<UnitSizes> sizes;
  for (const auto& u : r.units) sizes.push_back(sizes_of(u, shards));
  for (const auto& s : sizes) m.param_shards += s.rows0 * d.param_bytes;
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
    // Buffers of one collective: send and receive, (1 + shards) x padded elements either way.
    const auto set_bytes = [&](int64_t padded, int bytes) { return (1 + shards) * padded * bytes; };
    // In backward, at block i: the prefetched gather of block i - 1, the reduce-scatter of
    // block i and the one of block i + 1 still in flight, and with hybrid sharding the
    // all-reduce of block i + 2, which keeps only the reduced shard (UnitState::
    // track_reduction, ParamGroup::start_all_reduce). The pool keeps buffers by size and dtype,
    // so with one dtype gathers and reductions share them: the most alive at once.
    const int64_t reduced_shard = block_padded * d.reduce_bytes;
    int64_t block_sets = 0;
    if (d.compute_bytes == d.reduce_bytes) {
      block_sets = set_bytes(block_padded, d.reduce_bytes) * std::min<int64_t>(blocks, 3) +
                   (hybrid && blocks >= 4 ? reduced_shard : 0);
    } else {
      block_sets = set_bytes(block_padded, d.compute_bytes) * std::min<int64_t>(blocks, 1) +
                   set_bytes(block_padded, d.reduce_bytes) * std::min<int64_t>(blocks, 2) +
                   (hybrid && blocks >= 3 ? reduced_shard : 0);
    }
    // The root gathers once (it keeps its parameters through backward) and reduces last.
    const int64_t root_sets = d.compute_bytes == d.reduce_bytes
                                  ? set_bytes(sizes[0].padded, d.reduce_bytes)
                                  : set_bytes(sizes[0].padded, d.compute_bytes) +
                                        set_bytes(sizes[0].padded, d.reduce_bytes);
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
  // ends with the activations freed and every gradient shard present, beside autograd's full
  // gradients of the last unit (the root, the largest) before its reduce-scatter. The step
  // peaks at the larger of the two.
  int64_t largest_full = 0;
  for (const auto& s : sizes) largest_full = std::max(largest_full, s.full);
  const int64_t end_of_backward =
      m.grad_shards + (passthrough ? 0 : largest_full * d.compute_bytes);
  m.total = m.param_shards + m.optimizer_states + m.gathered_params + m.comm_buffers +
            unsharded_grads + std::max(m.activations, end_of_backward);

  if (!passthrough) {
    const int rph = l.ranks_per_host;
    const bool shard_crosses = rph > 0 && (shards > rph || rph % shards != 0);
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
    plan.collectives = {ag, rs};
    if (hybrid) plan.collectives.push_back(ar);
    for (const auto& c : plan.collectives) plan.comm_seconds_per_step += c.seconds_per_step;
  }

  if (r.capacity_bytes > 0 && m.total > r.capacity_bytes) {
    throw PlanError(fmt::format(
        "does not fit: a rank needs {:.2f} GiB (parameter shards {:.2f}, gradient shards {:.2f}, "
        "optimizer state {:.2f}, gathered parameters {:.2f}, communication buffers {:.2f}, "
        "activations {:.2f}) but has {:.2f} GiB; {} ranks per replica. Shard over more ranks "
        "(fewer replicas), checkpoint activations or shrink the batch",
        gib(m.total), gib(m.param_shards), gib(m.grad_shards), gib(m.optimizer_states),
        gib(m.gathered_params), gib(m.comm_buffers), gib(m.activations), gib(r.capacity_bytes),
        shards));
  }
  return plan;
}

std::string format_plan(const PlanRequest& r, const Plan& p) {
  const auto& m = p.memory;
  const Layout& l = r.layout;
  std::string out = fmt::format(
      "plan: world {} = {} replicas x {} shards{} | {} units | dtypes: params {} B, compute {} B, "
      "reduce {} B\n",
      l.world, l.replicas, l.shards(),
      l.ranks_per_host > 0 ? fmt::format(" | {} ranks per host", l.ranks_per_host) : "",
      r.units.size(), r.dtypes.param_bytes, r.dtypes.compute_bytes, r.dtypes.reduce_bytes);
  out += "memory per rank (the rank with the most rows):\n";
  auto row = [&](const char* what, int64_t b) {
    out += fmt::format("  {:<28} {:>10.3f} GiB {:>14} B\n", what, gib(b), b);
  };
  row("parameter shards", m.param_shards);
  row("gradient shards", m.grad_shards);
  row("optimizer state", m.optimizer_states);
  row("gathered parameters (peak)", m.gathered_params);
  row("communication buffers", m.comm_buffers);
  row("activations (peak)", m.activations);
  row("total (peak)", m.total);
  if (!p.collectives.empty()) {
    out += fmt::format("communication per step ({}):\n", r.comm.describe());
    for (const auto& c : p.collectives) {
      out += fmt::format("  {:<15} {:<9} group of {:>4} {:>6} calls {:>10.1f} MiB {:>10.2f} ms\n",
                         op_name(c.op), c.group, c.ranks, c.calls_per_step,
                         c.bytes_per_step / 1048576.0, 1e3 * c.seconds_per_step);
    }
    out += fmt::format("  total                                                  {:>10.2f} ms\n",
                       1e3 * p.comm_seconds_per_step);
  } else {
    out += "communication per step: none (one rank, its own dtypes)\n";
  }
  return out;
}

std::string plan_json(const PlanRequest& r, const Plan& p) {
  const auto& m = p.memory;
  nlohmann::json j;
  j["world"] = r.layout.world;
  j["replicas"] = r.layout.replicas;
  j["shards"] = r.layout.shards();
  j["memory"] = {{"param_shards", m.param_shards},
                 {"grad_shards", m.grad_shards},
                 {"optimizer_states", m.optimizer_states},
                 {"gathered_params", m.gathered_params},
                 {"comm_buffers", m.comm_buffers},
                 {"activations", m.activations},
                 {"total", m.total}};
  nlohmann::json cs = nlohmann::json::array();
  for (const auto& c : p.collectives) {
    cs.push_back({{"op", op_name(c.op)},
                  {"group", c.group},
                  {"ranks", c.ranks},
                  {"calls_per_step", c.calls_per_step},
                  {"bytes_per_step", c.bytes_per_step},
                  {"seconds_per_step", c.seconds_per_step}});
  }
  j["collectives"] = cs;
  j["comm_seconds_per_step"] = p.comm_seconds_per_step;
  return j.dump();
}

}  // namespace fsdp::plan
