#include "runtime/collectives.h"

namespace fsdp::detail {

void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send) {
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].copy_shard_to(send.narrow(0, layout.offset[i], params[i].padded_numel()));
  }
}

void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, const ProcessGroup& group, Accounting& acct) {
  const int world = group.size();
  auto per_rank = gathered.view({world, layout.total});
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t padded = params[i].shape().padded_numel(world);
    params[i].copy_full_from(per_rank.narrow(1, layout.offset[i], padded), world, acct);
    params[i].use_full();
  }
}

void copy_rows_for_rank(const std::vector<FsdpParam>& params, const FlatLayout& layout, int rank,
                        int world, const at::Tensor& dst) {
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamShape shape = params[i].shape();
    const auto rows = shard_range(shape.dim0, world, rank);
    auto out = dst.narrow(0, layout.offset[i], shape.padded_numel(world));
    const int64_t n = rows.rows() * shape.row_numel;
    if (n > 0) {
      out.narrow(0, 0, n).copy_(params[i].param().detach().narrow(0, rows.begin, rows.rows()).reshape(-1));
    }
    if (n < out.numel()) out.narrow(0, n, out.numel() - n).zero_();
  }
}

std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world) {
  auto per_rank = send.view({world, layout.total});
  std::vector<bool> had_grad(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) {
    if (layout.offset[i] < 0) {
      params[i].drop_full_grad();  // frozen since: its gradient is not reduced
      continue;
    }
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

at::Tensor all_gather_full(ProcessGroup& pg, const at::Tensor& shard,
                           const std::vector<int64_t>& full_shape) {
  const int world = pg.size();
  ParamShape shape{full_shape.at(0), 1};
  for (size_t d = 1; d < full_shape.size(); ++d) shape.row_numel *= full_shape[d];
  const int64_t padded = shape.padded_numel(world);
  auto send = at::zeros({padded}, shard.options());
  if (shard.numel() > 0) send.narrow(0, 0, shard.numel()).copy_(shard.detach().reshape(-1));
  auto all = at::empty({world * padded}, shard.options());
  pg.all_gather(all, send)->wait();
  auto full = at::empty(full_shape, shard.options());
  auto full_rows = full.view({shape.dim0, shape.row_numel});
  auto per_rank = all.view({world, padded});
  for (int r = 0; r < world; ++r) {
    const auto rows = shard_range(shape.dim0, world, r);
    if (rows.rows() == 0) continue;
    full_rows.narrow(0, rows.begin, rows.rows())
        .copy_(per_rank[r].narrow(0, 0, rows.rows() * shape.row_numel)
                   .view({rows.rows(), shape.row_numel}));
  }
  return full;
}

}  // namespace fsdp::detail
