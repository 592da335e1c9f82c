#include "fsdp/optim/clip_grad.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <cmath>
#include <map>
#include <tuple>

#include "fsdp/errors.h"
#include "fsdp/runtime/sharded_tensor.h"
#include "util/check.h"

namespace fsdp {

namespace {

// This rank's part of a p-norm: sum of |g|^p (or max |g|) over `grads`, each gradient's norm
// in float32 for 16-bit gradients (their own dtype would round each partial sum), combined in
// double so that mixed dtypes lose nothing. Batched as torch.nn.utils.clip_grad_norm_ does: one
// _foreach_norm per device and dtype (one kernel for all of them on CUDA, instead of one per
// gradient), on the gradients' device, without a host sync.
at::Tensor local_part(const std::vector<at::Tensor>& grads, double norm_type, at::Device device) {
  const bool inf = std::isinf(norm_type);
  // By device type, index and dtype: _foreach_norm takes lists of one of each.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> by_kind;
  for (const auto& grad : grads) {
    if (grad.numel() == 0) continue;
    by_kind[{static_cast<int>(grad.device().type()), grad.device().index(),
             static_cast<int>(grad.scalar_type())}]
        .push_back(grad);
  }
  std::vector<at::Tensor> norms;
  for (const auto& [kind, list] : by_kind) {
    const bool half = list.front().element_size() == 2;
    auto each = at::_foreach_norm(list, norm_type,
                                  half ? std::optional<at::ScalarType>(at::kFloat) : std::nullopt);
    norms.push_back(at::stack(each).to(at::kDouble).to(device));
  }
  if (norms.empty()) return at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  auto n = at::cat(norms);
  return (inf ? n.max() : n.pow(norm_type).sum()).reshape({1});
}

// One double per rank of `pg`, combined in rank order: the same total, bit for bit, on every
// rank. `p` is this rank's part (a sum of |g|^p, or a max for p = infinity).
double combine(const at::Tensor& part, ProcessGroup& pg, double norm_type) {
  const bool inf = std::isinf(norm_type);
  // On the group's device (gradients offloaded to the host are reduced by a GPU group).
  const at::Tensor mine = part.to(pg.device());
  auto all = at::empty({pg.size()}, mine.options());
  pg.all_gather(all, mine)->wait();
  auto parts = all.cpu();
  const double* v = parts.data_ptr<double>();
  double total = 0;
  // std::max would drop a NaN (it compares false); a NaN gradient must make the norm NaN.
  for (int r = 0; r < pg.size(); ++r) {
    total = !inf ? total + v[r] : (std::isnan(v[r]) || v[r] > total ? v[r] : total);
  }
  return total;
}

double finish_norm(double combined, double norm_type) {
  return std::isinf(norm_type) ? combined : std::pow(combined, 1.0 / norm_type);
}

void check_norm_type(double norm_type, const char* what) {
  FSDP_CHECK_ARG(norm_type > 0, "{}: norm_type must be positive (or infinity), got {}", what,
                 norm_type);
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  return grads;
}

// Shards of fully_shard units (their storage tells) must be sharded over exactly `pg`'s ranks:
// over more (the world of a hybrid mesh) every replica's copy of a shard would count again, a
// norm sqrt(replicas) too large; over fewer, shards would be missing.
void check_sharded_over(const std::vector<at::Tensor>& params, const ProcessGroup& pg,
                        const char* what) {
  for (const auto& p : params) {
    if (!p.grad().defined()) continue;
    const auto s = shard_of(p);
    if (!s || s->shard_group->size() == pg.size()) continue;
    const int replicas = s->replicate_group ? s->replicate_group->size() : 1;
    FSDP_CHECK_ARG(replicas == 1,
                   "{}: the parameters are sharded over {} ranks and replicated over {} "
                   "(hybrid sharding), but the group given has {} ranks: each replica's copy of "
                   "a shard would count again; pass the mesh (or its shard group), or clip the "
                   "model (clip_grad_norm_(model, ...))",
                   what, s->shard_group->size(), replicas, pg.size());
    throw InvalidArgument(fmt::format(
        "{}: the parameters are sharded over {} ranks, but the group given has {}; pass the "
        "group that shards them, or clip the model (clip_grad_norm_(model, ...))",
        what, s->shard_group->size(), pg.size()));
  }
}

// The global norm of the gradients of `params`, sharded over `pg`.
double global_norm(const std::vector<at::Tensor>& params, const ProcessGroupPtr& pg,
                   double norm_type, const char* what) {
  FSDP_CHECK_ARG(pg != nullptr, "{}: the process group is null", what);
  check_norm_type(norm_type, what);
  check_sharded_over(params, *pg, what);
  c10::NoGradGuard no_grad;
  const auto device = params.empty() ? pg->device() : params.front().device();
  return finish_norm(combine(local_part(defined_grads(params), norm_type, device), *pg, norm_type),
                     norm_type);
}

// The global norm of a model's gradients (clip_grad.h): shards over their group, whole
// parameters once (each rank adds 1/size of its own part, so equal copies count once). Under
// tensor parallelism (`tp` non-null) the same over each TP rank's slices, then combined over
// the TP group, where parameters equal on every TP rank add 1/size of their part.
double model_norm(const FSDPModule& model, double norm_type, const char* what,
                  std::vector<at::Tensor>& grads, const TensorParallelNorm* tp = nullptr) {
  check_norm_type(norm_type, what);
  FSDP_CHECK_ARG(model.nn_module() != nullptr, "{}: the module is empty", what);
  FSDP_CHECK_ARG(!tp || (tp->group && tp->sliced),
                 "{}: the tensor-parallel group or its "
                 "predicate is null",
                 what);
  c10::NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  // [sliced over TP?][sharded by a unit?]
  std::vector<at::Tensor> parts[2][2];
  ProcessGroupPtr group;
  for (const auto& [name, s] : parameter_gradient_shards(*model.nn_module())) {
    if (!s.local.grad().defined()) continue;
    grads.push_back(s.local.grad());
    const int sliced = tp && tp->group->size() > 1 && tp->sliced(name) ? 1 : 0;
    if (s.replicated) {
      parts[sliced][0].push_back(s.local.grad());
      continue;
    }
    FSDP_CHECK_ARG(!group || group == s.shard_group || group->size() == s.shard_group->size(),
                   "{}: the model's units are sharded over groups of different sizes ({} and "
                   "{} ranks); clip each group's parameters with the (params, group) form",
                   what, group->size(), s.shard_group->size());
    if (!group) group = s.shard_group;
    parts[sliced][1].push_back(s.local.grad());
  }
  const auto device = grads.empty() ? at::Device(at::kCPU) : grads.front().device();
  // This TP rank's part: summed (or maxed) over the unit's group, whole parameters 1/size each.
  auto over_units = [&](int sliced) {
    at::Tensor mine = local_part(parts[sliced][1], norm_type, device);
    const auto whole = local_part(parts[sliced][0], norm_type, device);
    if (!group) return mine.cpu().item<double>() + whole.cpu().item<double>();
    if (!parts[sliced][0].empty())
      mine = inf ? at::maximum(mine, whole) : mine + whole / group->size();
    return combine(mine, *group, norm_type);
  };
  if (!tp || tp->group->size() == 1) return finish_norm(over_units(0), norm_type);
  const double sliced = over_units(1), equal = over_units(0);
  // A NaN on either side stays NaN (std::max would drop it).
  const double mine = !inf ? sliced + equal / tp->group->size()
                           : (std::isnan(equal) || equal > sliced ? equal : sliced);
  auto part = at::full({1}, mine, at::TensorOptions().dtype(at::kDouble));
  return finish_norm(combine(part, *tp->group, norm_type), norm_type);
}

double clip_with(const std::vector<at::Tensor>& grads, double total, double max_norm,
                 double norm_type, bool error_if_nonfinite) {
  if (error_if_nonfinite && !std::isfinite(total)) {
    throw Error(fmt::format(
        "clip_grad_norm_: the total norm of order {} of the gradients is {}, so they cannot be "
        "clipped (left unchanged)",
        norm_type, total));
  }
  c10::NoGradGuard no_grad;
  const double coef = std::min(1.0, max_norm / (total + 1e-6));
  for (const auto& g : grads) g.mul_(coef);
  return total;
}

void check_max_norm(double max_norm) {
  FSDP_CHECK_ARG(std::isfinite(max_norm) && max_norm > 0,
                 "clip_grad_norm_: max_norm must be a positive finite number, got {}", max_norm);
}

}  // namespace

double total_grad_norm(const std::vector<at::Tensor>& params, const ProcessGroupPtr& pg,
                       double norm_type) {
  return global_norm(params, pg, norm_type, "total_grad_norm");
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const ProcessGroupPtr& pg, double norm_type, bool error_if_nonfinite) {
  check_max_norm(max_norm);
  const double total = global_norm(params, pg, norm_type, "clip_grad_norm_");
  return clip_with(defined_grads(params), total, max_norm, norm_type, error_if_nonfinite);
}

namespace {
// A mesh with tensor parallelism: the norm needs to know which parameters are slices.
void refuse_tp(const DeviceMesh& mesh, const char* what) {
  FSDP_CHECK_ARG(mesh.tp_size() == 1,
                 "{}: the mesh splits layers over {} tensor-parallel ranks, so each rank holds "
                 "slices and a norm over its parameters alone differs between them; pass the "
                 "model's tensor-parallel layout ({}(model, ..., tp::Layout), llama::tp_layout)",
                 what, mesh.tp_size(), what);
}
}  // namespace

double total_grad_norm(const std::vector<at::Tensor>& params, const DeviceMesh& mesh,
                       double norm_type) {
  refuse_tp(mesh, "total_grad_norm");
  return total_grad_norm(params, mesh.shard, norm_type);
}

double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const DeviceMesh& mesh, double norm_type, bool error_if_nonfinite) {
  refuse_tp(mesh, "clip_grad_norm_");
  return clip_grad_norm_(params, max_norm, mesh.shard, norm_type, error_if_nonfinite);
}

double total_grad_norm(const FSDPModule& model, double norm_type) {
  std::vector<at::Tensor> grads;
  return model_norm(model, norm_type, "total_grad_norm", grads);
}

double clip_grad_norm_(const FSDPModule& model, double max_norm, double norm_type,
                       bool error_if_nonfinite) {
  check_max_norm(max_norm);
  std::vector<at::Tensor> grads;
  const double total = model_norm(model, norm_type, "clip_grad_norm_", grads);
  return clip_with(grads, total, max_norm, norm_type, error_if_nonfinite);
}

double total_grad_norm(const FSDPModule& model, const TensorParallelNorm& tp, double norm_type) {
  std::vector<at::Tensor> grads;
  return model_norm(model, norm_type, "total_grad_norm", grads, &tp);
}

double clip_grad_norm_(const FSDPModule& model, double max_norm, const TensorParallelNorm& tp,
                       double norm_type, bool error_if_nonfinite) {
  check_max_norm(max_norm);
  std::vector<at::Tensor> grads;
  const double total = model_norm(model, norm_type, "clip_grad_norm_", grads, &tp);
  return clip_with(grads, total, max_norm, norm_type, error_if_nonfinite);
}

namespace {
TensorParallelNorm norm_of(const tp::Layout& tp) {
  // The layout by address: the norm lives only for the call that made it (no copy of its
  // slice map at every step).
  const tp::Layout* layout = &tp;
  return TensorParallelNorm{
      tp.group, [layout](const std::string& name) { return layout->slice_of(name) != nullptr; }};
}
}  // namespace

double clip_grad_norm_(const FSDPModule& model, double max_norm, const tp::Layout& tp,
                       double norm_type, bool error_if_nonfinite) {
  if (!tp.active()) return clip_grad_norm_(model, max_norm, norm_type, error_if_nonfinite);
  return clip_grad_norm_(model, max_norm, norm_of(tp), norm_type, error_if_nonfinite);
}

double total_grad_norm(const FSDPModule& model, const tp::Layout& tp, double norm_type) {
  if (!tp.active()) return total_grad_norm(model, norm_type);
  return total_grad_norm(model, norm_of(tp), norm_type);
}

}  // namespace fsdp
