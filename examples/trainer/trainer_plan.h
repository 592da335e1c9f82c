// --plan: the planner (fsdp/tools/planner.h) for the run a trainer's flags describe, at
// --plan-world ranks, without communication.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fsdp/tools/planner.h"
#include "train_options.h"

namespace trainer {

// What the planner needs of the model, for one micro-batch of `sequences` sequences per rank,
// split over `tp` ranks (tensor parallelism; InvalidArgument for a degree the model cannot take).
struct PlanModel {
  std::string describe;  // "MiniLLM vocab ... seq ..."
  std::function<std::vector<fsdp::plan::UnitSpec>(int64_t sequences, int compute_bytes,
                                                  bool checkpointed, int tp)>
      units;  // the root first, then the others in forward order
  std::function<int64_t(int64_t tokens, int tp)> transient_bytes;  // the loss's short-lived tensors
};

// The planner's request for these flags. Throws fsdp::plan::PlanError for an unreadable
// --plan-collectives table or a malformed --plan-links.
fsdp::plan::PlanRequest plan_request(const TrainOptions& o, const PlanModel& model);

// Prints the plan (and writes --plan-json; with --plan-search N, the N best layouts of the
// world after it); returns the exit code: 0, or 1 with the reason on stderr when it does not
// fit --plan-capacity-gib or cannot be computed.
int run_plan(const TrainOptions& o, const PlanModel& model);

}  // namespace trainer
