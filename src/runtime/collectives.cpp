#include "runtime/collectives.h"

#include <memory>

namespace fsdp::detail {
namespace {

// A hook that finished its collective before returning gives null: waited on as completed.
WorkPtr or_finished(WorkPtr work) { return work ? std::move(work) : completed_work(); }

}  // namespace

WorkPtr issue_all_gather(const CommHooks& hooks, ProcessGroup& group, const at::Tensor& output,
                         const at::Tensor& input, const std::vector<int64_t>& offsets) {
  if (!hooks.all_gather) return group.all_gather(output, input);
  return or_finished(hooks.all_gather(output, input, group, offsets));
}

WorkPtr issue_reduce_scatter(const CommHooks& hooks, ProcessGroup& group, const at::Tensor& output,
                             const at::Tensor& input, ReduceOp op) {
  if (!hooks.reduce_scatter) return group.reduce_scatter(output, input, op);
  return or_finished(hooks.reduce_scatter(output, input, group, op));
}

}  // namespace fsdp::detail
