// Planner: what a sharded training step will need per rank (memory) and per step
// (communication), predicted from the model's units, the layout and the dtypes before renting
// the machines, with the arithmetic the runtime itself uses (fsdp/runtime/layout.h: rows per
// rank, padded flat buffers, the backward schedule). bench/RESULTS.md holds it against
// measured runs.
//
//   fsdp::plan::PlanRequest req;  req.units = ...;  req.layout = {64, 8, 8};
//   req.comm = fsdp::plan::CommModel::links(350e9, 45e9, 20e-6);
//   auto plan = fsdp::plan::make_plan(req);   // throws PlanError when it does not fit
//   fmt::print("{}", fsdp::plan::format_plan(req, plan));
//
// Memory model, per rank, the rank with the most rows (rank 0):
// - parameter, gradient and optimizer-state shards (original dtype; AdamW: two states);
// - gathered parameters: the root's (kept from forward to backward) plus the largest other
//   unit's (one at a time: a prefetched unit holds only its gather's buffers), in the compute
//   dtype;
// - communication buffers: the flat send and receive buffers of the collectives alive at once
//   (in backward: gathers_ahead prefetched gathers and kReductionsInFlight reduce-scatters,
//   with hybrid sharding an all-reduce of a reduced shard). CPU runs keep freed buffers in a
//   pool by size, so these high-water marks stay allocated for the whole run: the model adds
//   them;
// - activations: what the units' forwards keep for backward (checkpointed units: their
//   inputs only, plus one unit's activations during its recompute), plus the step's transient
//   (the loss's gradients); the gradient shards fill in as the activations are freed, and at
//   the end of backward the full gradients of the largest unit (the root) wait for their
//   reduce-scatter, so the step peaks at the larger of the two moments.
// Communication: each collective's count per step, size, and time from a CommModel.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/runtime/layout.h"

namespace fsdp::plan {

// The plan cannot be met (the model does not fit in the capacity given); the message names
// the numbers.
class PlanError : public Error {
 public:
  using Error::Error;
};

// A parameter: rows of dim 0 (the dimension that is sharded) and elements per row.
using ParamShape = fsdp::ParamShape;

// One training step of a model as its plan_units function sees it (fsdp/models/*_plan.h): the
// model's config, the sequence length and micro-batch, the compute dtype's size, and whether
// every block is checkpointed. Each model's PlanShape is this with its Config.
template <typename ModelConfig>
struct StepShape {
  ModelConfig model;
  int64_t seq = 0;
  int64_t batch_per_rank = 0;  // sequences of one micro-batch on one rank
  int compute_bytes = 4;       // 4: fp32; 2: bf16 compute (MixedPrecisionPolicy::param_dtype)
  bool activation_checkpointing = false;  // of every block
  int tp = 1;  // tensor parallelism: each rank's slices and activations (declared last)
};

struct UnitSpec {
  std::string name;
  std::vector<ParamShape> params;  // the unit's own parameters (not those of units inside it)
  // Bytes its forward keeps for backward, for this rank's micro-batch in the compute dtype;
  // with checkpointing only checkpoint_input_bytes stay, and activation_bytes return for the
  // recompute of one unit at a time.
  int64_t activation_bytes = 0;
  int64_t checkpoint_input_bytes = 0;
  bool checkpointed = false;
  bool reshard_after_forward = true;  // false for the root (FSDP2's default)
  // Tensor parallelism (Layout::tp > 1): all-reduces over the TP group each forward of the
  // unit runs (its row-parallel outputs), each of `tp_all_reduce_bytes`; its backward runs as
  // many (the gradients of its column-parallel inputs), a checkpointed unit's recompute as
  // many again. `params` are then this rank's slices.
  int tp_all_reduces = 0;
  int64_t tp_all_reduce_bytes = 0;
};

struct Layout {
  int world = 1;
  int replicas = 1;        // hybrid sharding: world / (replicas x tp) ranks per shard group
  int ranks_per_host = 0;  // consecutive ranks per machine; 0: all on one
  // Tensor parallelism: groups of tp consecutive ranks split each layer (declared last: the
  // positional initialisation {world, replicas, ranks_per_host} keeps its meaning).
  int tp = 1;
  int shards() const { return world / replicas / tp; }
};

struct Dtypes {
  int param_bytes = 4;    // the parameters' own dtype (the shards, gradients, optimizer state)
  int compute_bytes = 4;  // MixedPrecisionPolicy::param_dtype
  int reduce_bytes = 4;   // MixedPrecisionPolicy::reduce_dtype
};

enum class Op { kAllGather, kReduceScatter, kAllReduce };
const char* op_name(Op op);

// Seconds one collective takes: `bytes` is the full buffer (all-gather: output; reduce-scatter:
// input; all-reduce: the tensor) over a group of `ranks`, `crosses_hosts` when its ranks sit on
// more than one machine.
class CommModel {
 public:
  // Bus bandwidths (bytes/s, nccl-tests' busbw) within a machine and between machines and a
  // fixed latency per collective: bytes x (n - 1) / n / busbw (all-reduce: twice that).
  static CommModel links(double intra_busbw, double inter_busbw, double latency_s);
  // Measured times: the CSV that collectives_bench --table writes (op,ranks,bytes,seconds),
  // interpolated log-log in bytes for the same op and group size. Throws PlanError naming the
  // op and group size when the table has no row for them.
  static CommModel measured(const std::string& csv_path);
  double seconds(Op op, int ranks, int64_t bytes, bool crosses_hosts) const;
  std::string describe() const;

 private:
  bool table_ = false;
  double intra_ = 0, inter_ = 0, latency_ = 0;
  std::string path_;
  std::map<std::tuple<int, int>, std::vector<std::pair<int64_t, double>>> rows_;  // (op, ranks)
};

struct PlanRequest {
  std::vector<UnitSpec> units;  // the root first, then the others in forward order
  Layout layout;
  Dtypes dtypes;
  int optimizer_states = 2;     // tensors of optimizer state per parameter (AdamW: 2)
  int64_t transient_bytes = 0;  // the step's largest short-lived tensors (logits, loss grads)
  int micro_batches = 1;        // gradient accumulation: activations are per micro-batch
  // Reduce after every micro-batch (no unsharded gradients kept) instead of after the last.
  bool reduce_every_micro_batch = false;
  // How collectives are timed. The default (10 GB/s everywhere, no latency) is a placeholder:
  // set links of the machines planned for, or a measured table.
  CommModel comm = CommModel::links(10e9, 10e9, 0);
  int64_t capacity_bytes = 0;  // per rank; 0: not checked
  // Gathers issued ahead of the unit computing (prefetch): kGathersAhead with the recorded
  // order; with set_modules_to_forward_prefetch / set_modules_to_backward_prefetch, the most
  // units one list names (each holds its gather's buffers until its turn). Declared last: 0.1.0's
  // positional initialisation keeps its meaning.
  int gathers_ahead = kGathersAhead;
};

struct MemoryPlan {
  int64_t param_shards = 0, grad_shards = 0, optimizer_states = 0;
  int64_t gathered_params = 0, comm_buffers = 0, activations = 0;
  int64_t total = 0;
};

struct CollectivePlan {
  std::string group;  // "shard", "replicate" or "tp"
  Op op = Op::kAllGather;
  int ranks = 1;
  int64_t calls_per_step = 0;
  int64_t bytes_per_step = 0;  // the sum of the calls' full buffers
  double seconds_per_step = 0;
};

struct Plan {
  MemoryPlan memory;
  std::vector<CollectivePlan> collectives;
  double comm_seconds_per_step = 0;
};

// Throws InvalidArgument for a layout that does not divide the world (or hosts that do not
// divide it), PlanError when capacity_bytes is set and the total exceeds it.
Plan make_plan(const PlanRequest& request);
// Its two halves: memory per rank, and the collectives per step (empty when one rank moves
// nothing).
MemoryPlan plan_memory(const PlanRequest& request);
std::vector<CollectivePlan> plan_collectives(const PlanRequest& request);
// The layouts (replicas x shards x tp) of `world` ranks that fit `capacity_bytes` (0: any),
// the fastest first by communication per step, then by memory: at most `count`. `request_for`
// builds the request of one layout (the units depend on the TP degree and the batch per rank);
// it may throw InvalidArgument for a layout the model cannot take (a TP degree that does not
// divide its heads), which is skipped. TP degrees are limited to the ranks of one host
// (ranks_per_host; 8 when 0) and to `max_tp`.
struct LayoutChoice {
  Layout layout;
  Plan plan;
};
std::vector<LayoutChoice> search_layouts(
    int world, int ranks_per_host, int max_tp,
    const std::function<PlanRequest(const Layout&)>& request_for, int64_t capacity_bytes,
    size_t count);
std::string format_layouts(const std::vector<LayoutChoice>& choices);

// A table of the memory per rank and of the collectives per step.
std::string format_plan(const PlanRequest& request, const Plan& plan);
// The same as one JSON object (bytes and seconds).
std::string plan_json(const PlanRequest& request, const Plan& plan);

}  // namespace fsdp::plan
