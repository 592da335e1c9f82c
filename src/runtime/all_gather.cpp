#include "runtime/all_gather.h"

namespace fsdp::detail {

// The copies are batched as FSDP2's are (_fsdp_collectives.py): one foreach copy for the
// copy-in, one split_with_sizes_copy for the copy-out, one _chunk_cat for the gradients. On
// CUDA each is one kernel (or a few) for the whole unit instead of one or more per parameter
// and rank; on the CPU they loop over the same copies, so the bytes are the same.

void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send, bool non_blocking) {
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
  if (!dst.empty()) at::_foreach_copy_(dst, src, non_blocking);
  if (!padding.empty()) at::_foreach_zero_(padding);
}

void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, int world) {
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
    full[i] = params[i].full().view(-1);
    exact = exact && full[i].numel() == world * sizes[i] && layout.offset[i] == sum &&
            params[i].shard_dim() == 0;
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
      if (params[i].shard_dim() != 0) {
        // Shard(d > 0), even: rank r's block is its chunk of dim d, contiguous; the full
        // tensor's dim d split as [world, chunk] and brought to the front is the same
        // [world, chunk shape] (one strided copy).
        const int d = params[i].shard_dim();
        auto split = params[i].full_shape();
        split[d] /= world;
        auto chunk_shape = split;
        split.insert(split.begin() + d, world);
        chunk_shape.insert(chunk_shape.begin(), world);
        dst.push_back(params[i].full().view(split).movedim(d, 0));
        src.push_back(per_rank.narrow(1, layout.offset[i], padded).view(chunk_shape));
        continue;
      }
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
      // Rows of dim 0, or the chunk of the sharded dim (a strided read, reshape copies it).
      out.narrow(0, 0, n).copy_(params[i]
                                    .param()
                                    .detach()
                                    .narrow(params[i].shard_dim(), rows.begin, rows.rows())
                                    .reshape(-1));
    }
    if (n < out.numel()) out.narrow(0, n, out.numel() - n).zero_();
  }
}

}  // namespace fsdp::detail
