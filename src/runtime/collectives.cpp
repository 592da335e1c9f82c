#include "runtime/collectives.h"

namespace fsdp::detail {
namespace {

FlatLayout layout_of(const std::vector<FsdpParam>& params, bool grads_only) {
  FlatLayout l;
  for (const auto& p : params) {
    const bool in = !grads_only || p.requires_grad();
    l.offset.push_back(in ? l.total : -1);
    if (in) l.total += p.padded_numel();
  }
  return l;
}

}  // namespace

FlatLayout gather_layout(const std::vector<FsdpParam>& params) {
  return layout_of(params, /*grads_only=*/false);
}

FlatLayout reduce_layout(const std::vector<FsdpParam>& params) {
  return layout_of(params, /*grads_only=*/true);
}

void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_shard_to(send.narrow(0, layout.offset[i], params[i].padded_numel()));
  }
}

void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, int world) {
  auto per_rank = gathered.view({world, layout.total});
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_full_from(per_rank.narrow(1, layout.offset[i], params[i].padded_numel()));
    params[i].use_full();
  }
}

std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world) {
  auto per_rank = send.view({world, layout.total});
  std::vector<bool> had_grad(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (layout.offset[i] < 0) continue;
    had_grad[i] = params[i].take_full_grad_into(
        per_rank.narrow(1, layout.offset[i], params[i].padded_numel()));
  }
  return had_grad;
}

void reduce_scatter_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                             const at::Tensor& reduced, const std::vector<bool>& had_grad) {
  for (size_t i = 0; i < params.size(); ++i) {
    if (!had_grad[i]) continue;
    params[i].accumulate_shard_grad(reduced.narrow(0, layout.offset[i], params[i].padded_numel()));
  }
}

}  // namespace fsdp::detail
