#include "runtime/collectives.h"

#include <memory>

namespace fsdp::detail {
namespace {

// What a hook that finished its collective before returning (null) is waited on as.
class FinishedWork final : public Work {
 public:
  bool is_completed() override { return true; }
  void wait() override {}
};

WorkPtr or_finished(WorkPtr work) {
  return work ? std::move(work) : std::make_shared<FinishedWork>();
}

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
