#include "fsdp/optim/fused_adamw.h"

#include <ATen/ops/_fused_adamw.h>
#include <torch/torch.h>

#include <map>
#include <tuple>

#include "fsdp/errors.h"
#include "util/check.h"
#include "util/profiler_range.h"

namespace fsdp {

torch::Tensor FusedAdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  using Key = std::tuple<int, int, int>;  // device type, device index, dtype
  struct Lists {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    std::vector<torch::optim::AdamWParamState*> states;
  };
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The kernel takes lists of one device and dtype: split the group by them.
    std::map<Key, Lists> buckets;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      FSDP_CHECK_ARG(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {
        // The state torch::optim::AdamW would create, so the two stay interchangeable.
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->exp_avg(torch::zeros_like(p, at::MemoryFormat::Preserve));
        s->exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        if (o.amsgrad()) s->max_exp_avg_sq(torch::zeros_like(p, at::MemoryFormat::Preserve));
        slot = std::move(s);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      auto& b = buckets[Key{static_cast<int>(p.device().type()), p.device().index(),
                            static_cast<int>(p.scalar_type())}];
      b.params.push_back(p);
      b.grads.push_back(p.grad());
      b.exp_avgs.push_back(s.exp_avg());
      b.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) b.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      // The kernel reads the step count, already advanced, from a float tensor (as
      // torch.optim's _fused_adamw does); the state keeps libtorch's integer count.
      b.steps.push_back(torch::full({}, static_cast<double>(s.step() + 1),
                                    torch::dtype(torch::kFloat).device(p.device())));
      b.states.push_back(&s);
    }
    for (auto& [key, b] : buckets) {
      // Bytes the kernel moves, for profiles (the trace drops long lists' shapes): it reads
      // parameters, gradients and both moments, and writes parameters and moments back.
      int64_t bytes = 0;
      for (const auto& p : b.params) bytes += 7 * static_cast<int64_t>(p.nbytes());
      FSDP_RANGE_BYTES("fsdp::optimizer::adamw", bytes);
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, b.steps,
                        o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(),
                        o.eps(), o.amsgrad(), /*maximize=*/false);
      for (auto* s : b.states) s->step(s->step() + 1);
    }
  }
  return loss;
}

}  // namespace fsdp
