#include "trainer_plan.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
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

namespace {

// The request of the flags' run laid out as `layout` (the batch split over its data-parallel
// ranks). InvalidArgument when the batch does not split.
fsdp::plan::PlanRequest request_for(const TrainOptions& o, const PlanModel& model,
                                    const fsdp::plan::Layout& layout) {
  const int dp = layout.world / layout.tp;
  if (o.batch % dp != 0 || (o.batch / dp) % o.grad_accum != 0) {
    throw fsdp::InvalidArgument(
        fmt::format("--batch {} does not split over {} data-parallel ranks "
                    "in {} micro-batches",
                    o.batch, dp, o.grad_accum));
  }
  const int64_t sequences = o.batch / dp / o.grad_accum;  // one micro-batch
  const int compute_bytes = o.dtype == Dtype::bf16 ? 2 : 4;
  fsdp::plan::PlanRequest r;
  r.units = model.units(sequences, compute_bytes, o.activation_checkpointing, layout.tp);
  for (size_t i = 1; i < r.units.size(); ++i) {
    r.units[i].reshard_after_forward = o.reshard_after_forward;
  }
  r.layout = layout;
  r.dtypes = {4, compute_bytes, 4};  // fp32 master weights; bf16 computes, reduces fp32
  r.optimizer_states = 2;            // AdamW: exp_avg, exp_avg_sq
  r.transient_bytes = model.transient_bytes(sequences * o.seq, layout.tp);
  r.micro_batches = o.grad_accum;
  r.reduce_every_micro_batch = o.grad_accum_sync;
  r.comm = comm_model(o);
  r.capacity_bytes = static_cast<int64_t>(o.plan_capacity_gib * 1024 * 1024 * 1024);
  return r;
}

}  // namespace

fsdp::plan::PlanRequest plan_request(const TrainOptions& o, const PlanModel& model) {
  return request_for(o, model, {o.plan_world, o.replicas, o.plan_ranks_per_host, o.tp});
}

// --plan-search: the best layouts of the world, whatever the flags' own.
void print_search(const TrainOptions& o, const PlanModel& model, int64_t capacity_bytes) {
  auto best = fsdp::plan::search_layouts(
      o.plan_world, o.plan_ranks_per_host, o.plan_world,
      [&](const fsdp::plan::Layout& l) { return request_for(o, model, l); }, capacity_bytes,
      static_cast<size_t>(o.plan_search));
  fmt::print(
      "the {} best layouts of {} ranks that fit{} (the fewest milliseconds of communication per "
      "step, then the least memory):\n{}",
      best.size(), o.plan_world,
      o.plan_capacity_gib > 0 ? fmt::format(" in {:g} GiB", o.plan_capacity_gib) : "",
      fsdp::plan::format_layouts(best));
}

int run_plan(const TrainOptions& o, const PlanModel& model) {
  int rc = 0;
  try {
    auto request = plan_request(o, model);
    fmt::print("{} seq {} | global batch {} ({} per {}rank{}){}\n", model.describe, o.seq, o.batch,
               o.batch / (o.plan_world / o.tp), o.tp > 1 ? "data-parallel " : "",
               o.grad_accum > 1 ? fmt::format(" in {} micro-batches", o.grad_accum) : "",
               o.activation_checkpointing ? " | activation checkpointing" : "");
    if (o.sp) {
      fmt::print(
          "note: --sp is planned as --tp without it: the activations it splits over the sequence "
          "and its all-gathers and reduce-scatters are not modeled yet\n");
    }
    try {
      auto plan = fsdp::plan::make_plan(request);
      fmt::print("{}", fsdp::plan::format_plan(request, plan));
      if (!o.plan_json.empty()) {
        errno = 0;
        std::ofstream out(o.plan_json);
        out << fsdp::plan::plan_json(request, plan) << "\n";
        out.close();  // the buffered write fails here on a full disk, not at `<<`
        if (!out) {
          fmt::print(stderr, "error: cannot write --plan-json {}{}\n", o.plan_json,
                     errno ? fmt::format(": {}", std::strerror(errno)) : "");
          return 1;
        }
      }
    } catch (const fsdp::plan::PlanError& e) {
      // A layout that does not fit: said, and the search (if asked) still runs.
      fmt::print(stderr, "error: plan: {}\n", e.what());
      std::fflush(stderr);
      rc = 1;
    }
    if (o.plan_search > 0) print_search(o, model, request.capacity_bytes);
    return rc;
  } catch (const fsdp::Error& e) {
    fmt::print(stderr, "error: plan: {}\n", e.what());
    return 1;
  }
}

}  // namespace trainer
