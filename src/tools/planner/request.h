// Internal: what the planner's two halves share about a request.
#pragma once

#include <vector>

#include "fsdp/tools/planner.h"

namespace fsdp::plan::detail {

// Throws InvalidArgument for a request that no run could have.
void check_request(const PlanRequest& r);
// Each unit's sizes over the shard group.
std::vector<UnitSizes> sizes_of(const PlanRequest& r);
// One rank holding everything in its own dtype moves nothing (ParamGroup's passthrough).
bool passthrough(const PlanRequest& r);

}  // namespace fsdp::plan::detail
