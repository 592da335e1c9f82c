// make_plan (planner.h): the memory and collectives halves, checked against the capacity,
// and their table and JSON.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>

#include "fsdp/tools/planner.h"
#include "tools/planner/request.h"
#include "util/check.h"

namespace fsdp::plan {
namespace detail {

void check_request(const PlanRequest& r) {
  const Layout& l = r.layout;
  FSDP_CHECK_ARG(!r.units.empty(), "plan: the model has no units");
  FSDP_CHECK_ARG(l.world >= 1, "plan: the world must have at least 1 rank, got {}", l.world);
  FSDP_CHECK_ARG(l.tp >= 1 && l.world % l.tp == 0,
                 "plan: a tensor-parallel degree of {} does not divide a world of {} ranks", l.tp,
                 l.world);
  FSDP_CHECK_ARG(l.replicas >= 1 && (l.world / l.tp) % l.replicas == 0,
                 "plan: {} replicas do not divide a world of {} ranks{}", l.replicas, l.world,
                 l.tp > 1 ? fmt::format(" over {} data-parallel ranks", l.world / l.tp) : "");
  FSDP_CHECK_ARG(
      l.ranks_per_host >= 0 && (l.ranks_per_host == 0 || l.world % l.ranks_per_host == 0),
      "plan: {} ranks per host do not divide a world of {} ranks", l.ranks_per_host, l.world);
  FSDP_CHECK_ARG(r.micro_batches >= 1, "plan: micro_batches must be >= 1, got {}", r.micro_batches);
  FSDP_CHECK_ARG(r.gathers_ahead >= 0, "plan: gathers_ahead must be >= 0, got {}", r.gathers_ahead);
  for (int b : {r.dtypes.param_bytes, r.dtypes.compute_bytes, r.dtypes.reduce_bytes}) {
    FSDP_CHECK_ARG(b == 2 || b == 4 || b == 8, "plan: dtype sizes must be 2, 4 or 8 bytes, got {}",
                   b);
  }
}

std::vector<UnitSizes> sizes_of(const PlanRequest& r) {
  std::vector<UnitSizes> out;
  for (const auto& u : r.units) out.push_back(unit_sizes(u.params, r.layout.shards()));
  return out;
}

bool passthrough(const PlanRequest& r) {
  const Dtypes& d = r.dtypes;
  return r.layout.shards() == 1 && r.layout.replicas == 1 && d.compute_bytes == d.param_bytes &&
         d.reduce_bytes == d.param_bytes;
}

}  // namespace detail

namespace {
double gib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024 * 1024); }
}  // namespace

Plan make_plan(const PlanRequest& r) {
  Plan plan;
  plan.memory = plan_memory(r);
  plan.collectives = plan_collectives(r);
  for (const auto& c : plan.collectives) plan.comm_seconds_per_step += c.seconds_per_step;
  const MemoryPlan& m = plan.memory;
  if (r.capacity_bytes > 0 && m.total > r.capacity_bytes) {
    throw PlanError(fmt::format(
        "does not fit: a rank needs {:.2f} GiB (parameter shards {:.2f}, gradient shards {:.2f}, "
        "optimizer state {:.2f}, gathered parameters {:.2f}, communication buffers {:.2f}, "
        "activations {:.2f}) but has {:.2f} GiB; {} ranks per replica. Shard over more ranks "
        "(fewer replicas), split layers over more ranks (tensor parallelism), checkpoint "
        "activations or shrink the batch",
        gib(m.total), gib(m.param_shards), gib(m.grad_shards), gib(m.optimizer_states),
        gib(m.gathered_params), gib(m.comm_buffers), gib(m.activations), gib(r.capacity_bytes),
        r.layout.shards()));
  }
  return plan;
}

std::string format_plan(const PlanRequest& r, const Plan& p) {
  const auto& m = p.memory;
  const Layout& l = r.layout;
  std::string out = fmt::format(
      "plan: world {} = {} replicas x {} shards{}{} | {} units | dtypes: params {} B, compute {} "
      "B, reduce {} B\n",
      l.world, l.replicas, l.shards(), l.tp > 1 ? fmt::format(" x tp {}", l.tp) : "",
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

std::vector<LayoutChoice> search_layouts(
    int world, int ranks_per_host, int max_tp,
    const std::function<PlanRequest(const Layout&)>& request_for, int64_t capacity_bytes,
    size_t count) {
  FSDP_CHECK_ARG(world >= 1, "plan: the world must have at least 1 rank, got {}", world);
  const int host = ranks_per_host > 0 ? ranks_per_host : 8;
  std::vector<LayoutChoice> out;
  for (int tp = 1; tp <= std::min({world, host, max_tp}); ++tp) {
    if (world % tp != 0 || host % tp != 0) continue;
    const int dp = world / tp;
    for (int replicas = 1; replicas <= dp; ++replicas) {
      if (dp % replicas != 0) continue;
      Layout l{world, replicas, ranks_per_host, tp};
      PlanRequest r;
      try {
        r = request_for(l);
      } catch (const InvalidArgument&) {
        continue;  // a layout the model cannot take
      }
      r.layout = l;
      r.capacity_bytes = 0;
      Plan p = make_plan(r);
      if (capacity_bytes > 0 && p.memory.total > capacity_bytes) continue;
      out.push_back({l, p});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const LayoutChoice& a, const LayoutChoice& b) {
    if (a.plan.comm_seconds_per_step != b.plan.comm_seconds_per_step) {
      return a.plan.comm_seconds_per_step < b.plan.comm_seconds_per_step;
    }
    return a.plan.memory.total < b.plan.memory.total;
  });
  if (out.size() > count) out.resize(count);
  return out;
}

std::string format_layouts(const std::vector<LayoutChoice>& choices) {
  std::string out = fmt::format("{:<26} {:>12} {:>16}   {}\n", "layout (replicas x shards x tp)",
                                "memory/rank", "comm/step", "by group");
  for (const auto& c : choices) {
    std::string groups;
    std::map<std::string, double> by_group;
    for (const auto& col : c.plan.collectives) by_group[col.group] += col.seconds_per_step;
    for (const auto& [g, sec] : by_group) {
      groups += fmt::format("{}{} {:.1f} ms", groups.empty() ? "" : ", ", g, 1e3 * sec);
    }
    out +=
        fmt::format("{:<31} {:>8.2f} GiB {:>13.1f} ms   {}\n",
                    fmt::format("{} x {} x {}", c.layout.replicas, c.layout.shards(), c.layout.tp),
                    gib(c.plan.memory.total), 1e3 * c.plan.comm_seconds_per_step, groups);
  }
  return out;
}

std::string plan_json(const PlanRequest& r, const Plan& p) {
  const auto& m = p.memory;
  nlohmann::json j;
  j["world"] = r.layout.world;
  j["replicas"] = r.layout.replicas;
  j["shards"] = r.layout.shards();
  j["tp"] = r.layout.tp;
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
