#include "fsdp/optim/fused_adamw.h"

#include <ATen/ops/_fused_adamw.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <map>
#include <tuple>
#include <unordered_set>

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
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
    std::vector<torch::optim::AdamWParamState*> states;
    // State offload: the device parameters the host copies in `params` are written back to.
    std::vector<std::pair<at::Tensor, at::Tensor>> write_back;
  };
  for (auto& group : param_groups()) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    // The kernel takes lists of one device and dtype: split the group by them.
    std::map<Key, Lists> buckets;
    // State offload's copies to where the state is (destination, source), issued together, and
    // the devices they come from (each waited for once).
    std::vector<std::pair<at::Tensor, at::Tensor>> staged;
    std::unordered_set<c10::Device> staged_from;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      FSDP_CHECK_ARG(!p.grad().is_sparse(), "FusedAdamW: sparse gradients are not supported");
      auto& slot = state_[p.unsafeGetTensorImpl()];
      if (!slot) {
        // The state torch::optim::AdamW would create, so the two stay interchangeable; with
        // state offload, in host memory.
        auto zeros = [&] {
          return offload_state_ ? torch::zeros(p.sizes(), p.options().device(at::kCPU))
                                : torch::zeros_like(p, at::MemoryFormat::Preserve);
        };
        auto s = std::make_unique<torch::optim::AdamWParamState>();
        s->exp_avg(zeros());
        s->exp_avg_sq(zeros());
        if (o.amsgrad()) s->max_exp_avg_sq(zeros());
        slot = std::move(s);
      }
      auto& s = static_cast<torch::optim::AdamWParamState&>(*slot);
      if (offload_state_ && !s.exp_avg().is_cpu()) {
        // State made elsewhere (loaded from a checkpoint next to the parameter) moves to the
        // host once, at the first step after the switch.
        s.exp_avg(s.exp_avg().to(at::kCPU));
        s.exp_avg_sq(s.exp_avg_sq().to(at::kCPU));
        if (s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(s.max_exp_avg_sq().to(at::kCPU));
      }
      // Where the update runs: where the state is. Offloaded state steps on host copies of the
      // parameter and gradient (staged in pinned memory when they come from a GPU, so that the
      // copies are asynchronous and wait once per step, not once per parameter), written back
      // after (copies even for a parameter on the host, so a machine without a GPU runs the
      // same path).
      at::Tensor param = p, grad = p.grad();
      if (offload_state_ || s.exp_avg().device() != p.device()) {
        const auto where = s.exp_avg().device();
        const bool pin = pin_memory_ && where.is_cpu() && !p.is_cpu();
        param = at::empty(p.sizes(), p.options().device(where).pinned_memory(pin));
        grad = at::empty(p.grad().sizes(), p.grad().options().device(where).pinned_memory(pin));
        staged.emplace_back(param, p);
        staged.emplace_back(grad, p.grad());
        if (!p.is_cpu()) staged_from.insert(p.device());
      }
      auto& b = buckets[Key{static_cast<int>(param.device().type()), param.device().index(),
                            static_cast<int>(param.scalar_type())}];
      if (!param.is_same(p)) b.write_back.emplace_back(p, param);
      b.params.push_back(param);
      b.grads.push_back(grad);
      b.exp_avgs.push_back(s.exp_avg());
      b.exp_avg_sqs.push_back(s.exp_avg_sq());
      if (o.amsgrad()) b.max_exp_avg_sqs.push_back(s.max_exp_avg_sq());
      b.states.push_back(&s);
    }
    for (auto& [dst, src] : staged) dst.copy_(src, /*non_blocking=*/true);
    for (const auto& device : staged_from) {
      c10::impl::VirtualGuardImpl impl(device.type());
      impl.getStream(device).synchronize();
    }
    for (auto& [key, b] : buckets) {
      // Bytes the kernel moves, for profiles (the trace drops long lists' shapes): it reads
      // parameters, gradients and both moments, and writes parameters and moments back.
      int64_t bytes = 0;
      for (const auto& p : b.params) bytes += 7 * static_cast<int64_t>(p.nbytes());
      FSDP_RANGE_BYTES("fsdp::optimizer::adamw", bytes);
      // The kernel reads each parameter's step count, already advanced, from a float tensor
      // (as torch.optim's _fused_adamw does; the state keeps libtorch's integer count). The
      // kernel only reads it: parameters at the same count (all of them, in a normal run)
      // share one tensor, so a step makes one per count, not one per parameter.
      std::map<int64_t, at::Tensor> step_tensors;
      std::vector<at::Tensor> steps;
      steps.reserve(b.states.size());
      for (auto* s : b.states) {
        auto& t = step_tensors[s->step() + 1];
        if (!t.defined()) {
          t = torch::full({}, static_cast<double>(s->step() + 1),
                          torch::dtype(torch::kFloat).device(b.params.front().device()));
        }
        steps.push_back(t);
      }
      at::_fused_adamw_(b.params, b.grads, b.exp_avgs, b.exp_avg_sqs, b.max_exp_avg_sqs, steps,
                        o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(),
                        o.eps(), o.amsgrad(), /*maximize=*/false);
      for (auto* s : b.states) s->step(s->step() + 1);
      // Asynchronous from pinned memory: the caching host allocator keeps a staging buffer
      // until the copy that reads it has run.
      for (auto& [device_param, host_param] : b.write_back) {
        device_param.copy_(host_param, /*non_blocking=*/true);
      }
    }
  }
  return loss;
}

}  // namespace fsdp
