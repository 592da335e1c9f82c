#include "trainer_plan.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

namespace trainer {
namespace {

fsdp::plan::CommModel comm_model(const TrainOptions& o) {
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

fsdp::plan::PlanRequest plan_request(const TrainOptions& o, const PlanModel& model) {
  const int world = o.plan_world;
  const int64_t sequences = o.batch / world / o.grad_accum;  // one micro-batch
  const int compute_bytes = o.dtype == "bf16" ? 2 : 4;
  fsdp::plan::PlanRequest r;
  r.units = model.units(sequences, compute_bytes, o.activation_checkpointing);
  for (size_t i = 1; i < r.units.size(); ++i) {
    r.units[i].reshard_after_forward = o.reshard_after_forward;
  }
  r.layout = {world, o.replicas, o.plan_ranks_per_host};
  r.dtypes = {4, compute_bytes, 4};  // fp32 master weights; bf16 computes, reduces fp32
  r.optimizer_states = 2;            // AdamW: exp_avg, exp_avg_sq
  r.transient_bytes = model.transient_bytes(sequences * o.seq);
  r.micro_batches = o.grad_accum;
  r.reduce_every_micro_batch = o.grad_accum_sync;
  r.comm = comm_model(o);
  r.capacity_bytes = static_cast<int64_t>(o.plan_capacity_gib * 1024 * 1024 * 1024);
  return r;
}

int run_plan(const TrainOptions& o, const PlanModel& model) {
  try {
    auto request = plan_request(o, model);
    auto plan = fsdp::plan::make_plan(request);
    fmt::print("{} seq {} | global batch {} ({} per rank{}){}\n{}", model.describe, o.seq, o.batch,
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

}  // namespace trainer
