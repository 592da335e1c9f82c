#include "fsdp/clip_grad.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>

#include "comm/detail/reduce_util.h"
#include "fsdp/errors.h"
#include "runtime/local_shards.h"

namespace fsdp {

namespace {

// The global norm of the defined gradients of `params`; `grads` receives them.
double global_norm(const std::vector<at::Tensor>& params, const ProcessGroupPtr& pg,
                   double norm_type, std::vector<at::Tensor>& grads, const char* what) {
  FSDP_CHECK_ARG(pg != nullptr, "{}: the process group is null", what);
  FSDP_CHECK_ARG(norm_type > 0, "{}: norm_type must be positive (or infinity), got {}", what,
                 norm_type);
  const bool inf = std::isinf(norm_type);
  c10::NoGradGuard no_grad;
  // Replicas hold the same gradient shards: summing over the world would count each one once
  // per replica (the norm off by sqrt(replicas)). Each shard must be counted once, over the
  // group that shards it.
  for (const auto& p : params) {
    auto [shard, replicate] = detail::sharding_groups_of(p);
    FSDP_CHECK_ARG(!replicate || shard->size() == pg->size(),
                   "{}: the parameters are sharded over {} ranks and replicated {} times "
                   "(hybrid sharding), but the group given has {} ranks; pass the DeviceMesh "
                   "(or mesh.shard), which counts each gradient shard once",
                   what, shard->size(), replicate->size(), pg->size());
  }

  // This rank's part, on the gradients' device without a host sync: sum of |g|^p (or max |g|)
  // over its gradients, each gradient's norm in its own dtype (float for 16-bit ones), the
  // combination in double so that mixed dtypes lose nothing.
  const auto device = params.empty() ? at::Device(pg->device_type()) : params.front().device();
  auto opts = at::TensorOptions().dtype(at::kDouble).device(device);
  std::vector<at::Tensor> norms;
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    grads.push_back(p.grad());
    if (p.grad().numel() == 0) continue;
    auto g = detail::accumulation_buffer(p.grad());  // float32 for 16-bit gradients
    norms.push_back((inf ? g.abs().max() : g.norm(norm_type)).to(at::kDouble).reshape({1}));
  }
  at::Tensor mine = at::zeros({1}, opts);
  if (!norms.empty()) {
    auto n = at::cat(norms);
    mine = (inf ? n.max() : n.pow(norm_type).sum()).reshape({1});
  }

  // One double per rank, combined in rank order: the same total, bit for bit, on every rank.
  auto all = at::empty({pg->size()}, opts);
  pg->all_gather(all, mine)->wait();
  auto parts = all.cpu();
  const double* v = parts.data_ptr<double>();
  double total = 0;
  // std::max would drop a NaN (it compares false); a NaN gradient must make the norm NaN.
  for (int r = 0; r < pg->size(); ++r) {
    total = !inf ? total + v[r] : (std::isnan(v[r]) || v[r] > total ? v[r] : total);
  }
  if (!inf) total = std::pow(total, 1.0 / norm_type);
  return total;
}

}  // namespace

double total_grad_norm(const std::vector<at::Tensor>& params, const ProcessGroupPtr& pg,
                       double norm_type) {
  std::vector<at::Tensor> grads;
  return global_norm(params, pg, norm_type, grads, "total_grad_norm");
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const ProcessGroupPtr& pg, double norm_type, bool error_if_nonfinite) {
  FSDP_CHECK_ARG(std::isfinite(max_norm) && max_norm > 0,
                 "clip_grad_norm_: max_norm must be a positive finite number, got {}", max_norm);
  std::vector<at::Tensor> grads;
  const double total = global_norm(params, pg, norm_type, grads, "clip_grad_norm_");
  if (error_if_nonfinite && !std::isfinite(total)) {
    throw Error(fmt::format(
        "clip_grad_norm_: the total norm of order {} of the gradients is {}, so they cannot be "
        "clipped (left unchanged)",
        norm_type, total));
  }
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  for (auto& g : grads) g.mul_(coef);
  return total;
}

double total_grad_norm(const std::vector<at::Tensor>& params, const DeviceMesh& mesh,
                       double norm_type) {
  return total_grad_norm(params, mesh.shard, norm_type);
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const DeviceMesh& mesh, double norm_type, bool error_if_nonfinite) {
  return clip_grad_norm_(params, max_norm, mesh.shard, norm_type, error_if_nonfinite);
}

}  // namespace fsdp
