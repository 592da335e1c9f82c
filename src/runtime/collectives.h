// Internal: a unit's collectives as its communication hooks say (fsdp/runtime/comm_hooks.h):
// the hook when one is set, the group's own collective otherwise.
#pragma once

#include <ATen/ATen.h>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/comm_hooks.h"

namespace fsdp::detail {

struct CommHooks {
  AllGatherComm all_gather;
  ReduceScatterComm reduce_scatter;
  AllReduceHook all_reduce;
};

// The Work to wait on; never null (a hook that returns null has finished).
// `offsets`: where each parameter starts in `input` (the hook's argument).
WorkPtr issue_all_gather(const CommHooks& hooks, ProcessGroup& group, const at::Tensor& output,
                         const at::Tensor& input, const std::vector<int64_t>& offsets);
WorkPtr issue_reduce_scatter(const CommHooks& hooks, ProcessGroup& group, const at::Tensor& output,
                             const at::Tensor& input, ReduceOp op);

}  // namespace fsdp::detail
