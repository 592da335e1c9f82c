#include "runtime/collectives.h"

namespace fsdp::detail {

// The copies are batched as FSDP2's are (_fsdp_collectives.py): one foreach copy for the
// copy-in, one split_with_sizes_copy for the copy-out, one _chunk_cat for the gradients. On
// CUDA each is one kernel (or a few) for the whole unit instead of one or more per parameter
// and rank; on the CPU they loop over the same copies, so the bytes are the same.

void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send) {
  std::vector<at::Tensor> dst, src, padding;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& shard = params[i].shard();
    const int64_t n = shard.numel(), padded = params[i].padded_numel();
    auto slot = send.narrow(0, layout.offset[i], padded);
    if (n > 0) {
      dst.push_back(slot.narrow(0, 0, n));
      src.push_back(shard.view(-1));
    }
    // Padding is sent too: zero exactly the tails rather than the whole buffer.
    if (n < padded) padding.push_back(slot.narrow(0, n, padded - n));
  }
  // Casts to the buffer's (compute) dtype on the way, as copy_ does.
  if (!dst.empty()) at::_foreach_copy_(dst, src);
  if (!padding.empty()) at::_foreach_zero_(padding);
}

void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, const ProcessGroup& group, Accounting& acct) {
  const int world = group.size();
  auto per_rank = gathered.view({world, layout.total});
  // Rows are dealt to ranks in blocks of ceil(dim0 / world) (torch.chunk), so a parameter's
  // full tensor is the first numel elements of its [world, padded] block read rank after rank.
  // When that is all of the block for every parameter (the rows divide), the copy-out is
  // FSDP2's split_with_sizes_copy straight into the full tensors.
  std::vector<at::Tensor> full(params.size());
  std::vector<int64_t> sizes(params.size());
  bool exact = true;
  int64_t sum = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    sizes[i] = params[i].shape().padded_numel(world);
    full[i] = params[i].allocate_full_tensor(acct).view(-1);
    exact = exact && full[i].numel() == world * sizes[i] && layout.offset[i] == sum;
    sum += sizes[i];
  }
  if (exact && sum == layout.total) {
    std::vector<at::Tensor> out;
    for (size_t i = 0; i < params.size(); ++i) out.push_back(full[i].view({world, sizes[i]}));
    at::NoGradGuard no_grad;
    at::split_with_sizes_copy_out(out, per_rank, sizes, /*dim=*/1);
  } else {
    // Padded rows: per parameter the ranks whose rows are all real (one strided copy), then the
    // part of the next rank's rows that is real.
    std::vector<at::Tensor> dst, src;
    for (size_t i = 0; i < params.size(); ++i) {
      const int64_t numel = full[i].numel(), padded = sizes[i];
      if (numel == 0 || padded == 0) continue;
      const int64_t whole = numel / padded, rest = numel % padded;
      auto block = per_rank.narrow(1, layout.offset[i], padded);
      if (whole > 0) {
        dst.push_back(full[i].narrow(0, 0, whole * padded).view({whole, padded}));
        src.push_back(block.narrow(0, 0, whole));
      }
      if (rest > 0) {
        dst.push_back(full[i].narrow(0, whole * padded, rest));
        src.push_back(block[whole].narrow(0, 0, rest));
      }
    }
    at::NoGradGuard no_grad;
    if (!dst.empty()) at::_foreach_copy_(dst, src);
  }
  for (auto& p : params) p.use_full();
}

void copy_rows_for_rank(const std::vector<FsdpParam>& params, const FlatLayout& layout, int rank,
                        int world, const at::Tensor& dst) {
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamShape shape = params[i].shape();
    const auto rows = shard_range(shape.dim0, world, rank);
    auto out = dst.narrow(0, layout.offset[i], shape.padded_numel(world));
    const int64_t n = rows.rows() * shape.row_numel;
    if (n > 0) {
      out.narrow(0, 0, n).copy_(
          params[i].param().detach().narrow(0, rows.begin, rows.rows()).reshape(-1));
    }
    if (n < out.numel()) out.narrow(0, n, out.numel() - n).zero_();
  }
}

namespace {

// One parameter's gradient rows into a [world, padded] view, each rank's rows at its place and
// zeros for padding, casting to the view's dtype (FsdpParam::take_full_grad_into's copy).
void copy_grad_rows(const FsdpParam& p, const at::Tensor& grad, const at::Tensor& dst) {
  const int64_t row_numel = p.shape().row_numel, padded = p.padded_numel();
  auto rows = grad.reshape({p.shape().dim0, row_numel});
  for (int r = 0; r < p.world(); ++r) {
    const ShardRange& range = p.range(r);
    const int64_t n = range.rows() * row_numel;
    if (n > 0) {
      dst[r]
          .narrow(0, 0, n)
          .view({range.rows(), row_numel})
          .copy_(rows.narrow(0, range.begin, range.rows()));
    }
    if (n < padded) dst[r].narrow(0, n, padded - n).zero_();
  }
}

}  // namespace

std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world) {
  std::vector<bool> had_grad(params.size(), false);
  std::vector<at::Tensor> grads;
  std::vector<size_t> index;
  bool same_dtype = true;
  for (size_t i = 0; i < params.size(); ++i) {
    if (layout.offset[i] < 0) {
      params[i].drop_full_grad();  // frozen since: its gradient is not reduced
      continue;
    }
    at::Tensor g = params[i].take_full_grad();
    had_grad[i] = g.defined();
    // No gradient contributes zeros (rare: a parameter unused in this backward).
    if (!g.defined()) g = at::zeros(params[i].full_shape(), send.options());
    same_dtype = same_dtype && g.scalar_type() == send.scalar_type();
    grads.push_back(std::move(g));
    index.push_back(i);
  }
  if (grads.empty()) return had_grad;
  at::Tensor per_rank = send.view({world, layout.total});
  at::NoGradGuard no_grad;
  if (same_dtype || !send.is_cpu()) {
    // FSDP2's foreach_reduce_scatter_copy_in: chunk every gradient into `world` blocks of
    // ceil(dim0 / world) rows (torch.chunk, padded with zeros) and lay rank r's blocks side by
    // side in row r, casting to the reduce dtype: exactly the flat layout. One kernel on CUDA;
    // _chunk_cat takes one input dtype, so mixed ones (kept gradients in the reduce dtype beside
    // this backward's) are cast first.
    bool one_dtype = true;
    for (const auto& g : grads) one_dtype = one_dtype && g.scalar_type() == grads[0].scalar_type();
    if (!one_dtype) {
      for (auto& g : grads) g = g.to(send.scalar_type());
    }
    at::_chunk_cat_out(per_rank, grads, /*dim=*/0, /*num_chunks=*/world);
  } else {
    // On the CPU, _chunk_cat's casting path is slower than copying rows (bf16 gradients of the
    // 32000 x 256 embedding and head into fp32: 23 against 14 to 18 ms, one thread).
    for (size_t k = 0; k < grads.size(); ++k) {
      const size_t i = index[k];
      copy_grad_rows(params[i], grads[k],
                     per_rank.narrow(1, layout.offset[i], params[i].padded_numel()));
    }
  }
  return had_grad;
}

void reduce_scatter_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                             const at::Tensor& reduced, const std::vector<bool>& had_grad) {
  // Gradients that exist (accumulation) take one foreach add; new ones are allocated and
  // filled by one foreach copy (a fresh tensor each: `reduced` is a buffer about to be freed,
  // and optimizers detach_() grads, which views do not allow).
  std::vector<at::Tensor> sums, addends, fresh, sources;
  std::vector<size_t> fresh_index;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!had_grad[i]) continue;
    const at::Tensor& shard = params[i].shard();
    auto rows = reduced.narrow(0, layout.offset[i], params[i].padded_numel())
                    .narrow(0, 0, shard.numel())
                    .view(shard.sizes());
    const at::Tensor& grad = params[i].param().grad();
    if (grad.defined()) {
      sums.push_back(grad);
      addends.push_back(rows);
    } else {
      fresh.push_back(at::empty(shard.sizes(), shard.options()));
      sources.push_back(rows);
      fresh_index.push_back(i);
    }
  }
  at::NoGradGuard no_grad;
  if (!sums.empty()) at::_foreach_add_(sums, addends);
  if (!fresh.empty()) at::_foreach_copy_(fresh, sources);
  for (size_t k = 0; k < fresh.size(); ++k) {
    params[fresh_index[k]].param().mutable_grad() = std::move(fresh[k]);
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
        .copy_(per_rank[r]
                   .narrow(0, 0, rows.rows() * shape.row_numel)
                   .view({rows.rows(), shape.row_numel}));
  }
  return full;
}

}  // namespace fsdp::detail
