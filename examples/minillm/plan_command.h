// train_minillm --plan: the planner (fsdp/tools/planner.h) for the run the flags describe.
#pragma once

#include "fsdp/tools/planner.h"
#include "options.h"

namespace minillm {

// The planner's request for these flags at o.plan_world ranks. Throws fsdp::plan::PlanError
// for an unreadable --plan-collectives table or a malformed --plan-links.
fsdp::plan::PlanRequest plan_request(const Options& o);

// Prints the plan (and writes --plan-json); returns the exit code: 0, or 1 with the reason on
// stderr when it does not fit --plan-capacity-gib or cannot be computed.
int run_plan(const Options& o);

}  // namespace minillm
