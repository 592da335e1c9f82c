#include "plan_command.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "fsdp/models/minillm_plan.h"

namespace minillm {
namespace {

fsdp::plan::CommModel comm_model(const Options& o) {
  if (!o.plan_collectives.empty()) return fsdp::plan::CommModel::measured(o.plan_collectives);
  std::istringstream in(o.plan_links);
  double intra = 0, inter = 0, latency_us = -1;
  char c1 = 0, c2 = 0;
  if (!(in >> intra >> c1 >> inter >> c2 >> latency_us) || c1 != ',' || c2 != ',' || !in.eof() ||
      !(intra > 0) || !(inter > 0) || latency_us < 0) {
    throw fsdp::plan::PlanError(fmt::format(
        "--plan-links {}: expected INTRA,INTER,LATENCY (GB/s, GB/s, microseconds), positive "
        "bandwidths, e.g. 350,45,20",
        o.plan_links));
  }
  return fsdp::plan::CommModel::links(intra * 1e9, inter * 1e9, latency_us * 1e-6);
}

}  // namespace

fsdp::plan::PlanRequest plan_request(const Options& o) {
  const int world = o.plan_world;
  fsdp::models::minillm::PlanShape shape;
  shape.model = o.model;
  shape.seq = o.seq;
  shape.batch_per_rank = o.batch / world / o.grad_accum;  // one micro-batch
  shape.compute_bytes = o.dtype == "bf16" ? 2 : 4;
  shape.activation_checkpointing = o.activation_checkpointing;
  fsdp::plan::PlanRequest r;
  r.units = fsdp::models::minillm::plan_units(shape);
  for (size_t i = 1; i < r.units.size(); ++i) {
    r.units[i].reshard_after_forward = o.reshard_after_forward;
  }
  r.layout = {world, o.replicas, o.plan_ranks_per_host};
  r.dtypes = {4, shape.compute_bytes, 4};  // fp32 master weights; bf16 computes, reduces fp32
  r.optimizer_states = 2;                  // AdamW: exp_avg, exp_avg_sq
  r.transient_bytes = loss_transient_bytes(o.model, shape.batch_per_rank * o.seq);
  r.micro_batches = o.grad_accum;
  r.reduce_every_micro_batch = o.grad_accum_sync;
  r.comm = comm_model(o);
  r.capacity_bytes = static_cast<int64_t>(o.plan_capacity_gib * 1024 * 1024 * 1024);
  return r;
}

int run_plan(const Options& o) {
  try {
    auto request = plan_request(o);
    auto plan = fsdp::plan::make_plan(request);
    fmt::print(
        "MiniLLM vocab {} dim {} layers {} heads {} seq {} | global batch {} ({} per rank"
        "{}){}\n{}",
        o.model.vocab, o.model.dim, o.model.layers, o.model.heads, o.seq, o.batch,
        o.batch / o.plan_world,
        o.grad_accum > 1 ? fmt::format(" in {} micro-batches", o.grad_accum) : "",
        o.activation_checkpointing ? " | activation checkpointing" : "",
        fsdp::plan::format_plan(request, plan));
    if (!o.plan_json.empty()) {
      std::ofstream out(o.plan_json);
      out << fsdp::plan::plan_json(request, plan) << "\n";
      if (!out) {
        fmt::print(stderr, "error: cannot write --plan-json {}\n", o.plan_json);
        return 1;
      }
    }
    return 0;
  } catch (const fsdp::Error& e) {
    fmt::print(stderr, "error: plan: {}\n", e.what());
    return 1;
  }
}

}  // namespace minillm
