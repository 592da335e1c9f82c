#include "fsdp/parallel/tensor_parallel.h"

#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>

#include <limits>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp::tp {
namespace {

bool trivial(const ProcessGroupPtr& tp) { return tp == nullptr || tp->size() == 1; }

// The sum over the group, forward; the gradient passes unchanged (each rank's contribution to
// the sum has the sum's gradient). The backward needs no group, so none is kept in the graph.
struct ReduceFromTp : torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            ProcessGroup* tp) {
    auto out = x.contiguous().clone();
    tp->all_reduce(out, ReduceOp::kSum)->wait();
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

// [batch, seq, ...] <-> [seq, batch, ...]: the sequence first, so that each rank's chunk of it
// is one contiguous block of the flat collectives.
at::Tensor seq_first(const at::Tensor& x) { return x.transpose(0, 1).contiguous(); }

void check_sequence(const at::Tensor& x, int64_t seq, int size, const char* what) {
  FSDP_CHECK_ARG(x.dim() >= 2, "tp::{}: a [batch, seq, ...] tensor expected, got {} dimensions",
                 what, x.dim());
  FSDP_CHECK_ARG(seq % size == 0,
                 "tp::{}: sequence parallelism needs the sequence ({} tokens) to divide by the "
                 "tensor-parallel degree {}",
                 what, seq, size);
}

at::Tensor all_gather_seq(const at::Tensor& x, ProcessGroup& g) {
  auto first = seq_first(x);
  auto shape = first.sizes().vec();
  shape[0] *= g.size();
  auto out = at::empty(shape, first.options());
  g.all_gather(out, first)->wait();
  return out.transpose(0, 1).contiguous();
}

at::Tensor reduce_scatter_seq(const at::Tensor& x, ProcessGroup& g) {
  auto first = seq_first(x);
  auto shape = first.sizes().vec();
  shape[0] /= g.size();
  auto out = at::empty(shape, first.options());
  g.reduce_scatter(out, first, ReduceOp::kSum)->wait();
  return out.transpose(0, 1).contiguous();
}

// The group travels as an address in the graph: the header's contract is that the group
// outlives the autograd graph (the model's mesh does).
ProcessGroup& group_of(torch::autograd::AutogradContext* ctx) {
  return *reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
}

struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            ProcessGroup* tp) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(tp);
    return all_gather_seq(x, *tp);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {reduce_scatter_seq(grads[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            ProcessGroup* tp) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(tp);
    return reduce_scatter_seq(x, *tp);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return {all_gather_seq(grads[0], group_of(ctx)), at::Tensor()};
  }
};

}  // namespace

at::Tensor gather_sequence(const at::Tensor& x, const ProcessGroupPtr& tp) {
  if (trivial(tp)) return x;
  check_sequence(x, x.dim() >= 2 ? x.size(1) * tp->size() : 0, tp->size(), "gather_sequence");
  return GatherSequence::apply(x, tp.get());
}

at::Tensor reduce_scatter_sequence(const at::Tensor& x, const ProcessGroupPtr& tp) {
  if (trivial(tp)) return x;
  check_sequence(x, x.dim() >= 2 ? x.size(1) : 0, tp->size(), "reduce_scatter_sequence");
  return ReduceScatterSequence::apply(x, tp.get());
}

Chunk chunk_of(int64_t full, int size, int rank) {
  FSDP_CHECK_ARG(full >= 0 && size >= 1 && rank >= 0 && rank < size,
                 "tp::chunk_of: rank {} of {} over a dimension of {}", rank, size, full);
  const int64_t step = (full + size - 1) / size;  // torch.chunk's
  const int64_t begin = std::min(full, step * rank);
  return {begin, std::min(full, begin + step) - begin};
}

at::Tensor copy_to_tp(const at::Tensor& x, const ProcessGroupPtr& tp) {
  // No graph (no grad mode, or an input without gradient): nothing to sum in a backward.
  if (trivial(tp) || !at::GradMode::is_enabled() || !x.requires_grad()) return x;
  // A hook on this view sees the gradient of every use of it summed (q, k and v read the same
  // input): one all-reduce per call, as Megatron's f.
  auto y = x.view_as(x);
  y.register_hook([tp](const at::Tensor& grad) {
    auto sum = grad.contiguous().clone();
    tp->all_reduce(sum, ReduceOp::kSum)->wait();
    return sum;
  });
  return y;
}

at::Tensor reduce_from_tp(const at::Tensor& x, const ProcessGroupPtr& tp) {
  if (trivial(tp)) return x;
  return ReduceFromTp::apply(x, tp.get());
}

const TpSlice* Layout::slice_of(const std::string& name) const {
  if (!active()) return nullptr;
  auto it = slices.find(name.substr(0, name.find('#')));
  return it == slices.end() ? nullptr : &it->second;
}

at::Tensor gather_dim(const at::Tensor& local, int64_t dim, int64_t full,
                      const ProcessGroupPtr& tp) {
  if (trivial(tp)) return local;
  const int size = tp->size();
  FSDP_CHECK_ARG(local.dim() >= 1, "tp::gather_dim: a tensor of at least one dimension expected");
  dim = dim < 0 ? dim + local.dim() : dim;
  const auto mine = chunk_of(full, size, tp->rank());
  FSDP_CHECK_ARG(dim < local.dim() && local.size(dim) == mine.length,
                 "tp::gather_dim: rank {} holds {} of dimension {}; its chunk of {} over {} "
                 "ranks is {}",
                 tp->rank(), dim < local.dim() ? local.size(dim) : 0, dim, full, size, mine.length);
  at::NoGradGuard no_grad;
  const int64_t step = chunk_of(full, size, 0).length;
  // Chunks padded to the first's length, the dimension moved first so that each rank's part is
  // one contiguous block of the gather; on the group's device (host shards under CPU offload
  // go through a GPU group), the result back on the caller's.
  auto moved = local.movedim(dim, 0);
  std::vector<int64_t> block_shape = moved.sizes().vec();
  block_shape[0] = step;
  const auto on_group = local.options().device(tp->device());
  auto block = at::zeros(block_shape, on_group);
  block.narrow(0, 0, mine.length).copy_(moved);
  auto all_shape = block_shape;
  all_shape[0] = size * step;
  auto all = at::empty(all_shape, on_group);
  tp->all_gather(all, block)->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < size; ++r) {
    parts.push_back(all.narrow(0, r * step, chunk_of(full, size, r).length));
  }
  return at::cat(parts, 0).movedim(0, dim).contiguous().to(local.device());
}

at::Tensor gather_last_dim(const at::Tensor& local, int64_t full, const ProcessGroupPtr& tp) {
  return gather_dim(local, -1, full, tp);
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& local, const at::Tensor& targets,
                                        int64_t vocab_offset, int64_t vocab,
                                        const ProcessGroupPtr& tp, int64_t ignore_index) {
  const int size = tp ? tp->size() : 1;
  const int rank = tp ? tp->rank() : 0;
  const auto mine = chunk_of(vocab, size, rank);
  FSDP_CHECK_ARG(local.dim() == 2 && targets.dim() == 1 && local.size(0) == targets.size(0),
                 "tp::vocab_parallel_cross_entropy: logits [tokens, vocab chunk] and targets "
                 "[tokens] expected, got {} and {}",
                 local.sizes(), targets.sizes());
  FSDP_CHECK_ARG(local.size(1) == mine.length && vocab_offset == mine.offset,
                 "tp::vocab_parallel_cross_entropy: rank {} of {} holds columns [{}, {}) of "
                 "the logits; its chunk of a vocabulary of {} is [{}, {})",
                 rank, size, vocab_offset, vocab_offset + local.size(1), vocab, mine.offset,
                 mine.offset + mine.length);
  // Targets are the same on every rank of the group, so every rank reaches the same verdict.
  // On the host a check with a message; on a GPU a device-side assert (as cross_entropy's),
  // since reading the verdict back would stall every step on a host sync.
  const auto in_range = (((targets >= 0) & (targets < vocab)) | targets.eq(ignore_index)).all();
  if (in_range.device().is_cpu()) {
    FSDP_CHECK_ARG(in_range.item<bool>(),
                   "tp::vocab_parallel_cross_entropy: a target is outside the vocabulary [0, {}) "
                   "and is not the ignore index {}",
                   vocab, ignore_index);
  } else {
    at::_assert_async(in_range,
                      "tp::vocab_parallel_cross_entropy: a target is outside the vocabulary and "
                      "is not the ignore index");
  }
  const int64_t n = local.size(0);
  auto x = local.to(at::kFloat);
  // The max over the full vocabulary, per token: it only keeps exp() in range (the result
  // does not depend on it), so it carries no gradient.
  at::Tensor max;
  {
    at::NoGradGuard no_grad;
    auto mine_max = mine.length > 0
                        ? x.amax(1)
                        : at::full({n}, -std::numeric_limits<float>::infinity(), x.options());
    if (size > 1) {
      auto all = at::empty({size * n}, mine_max.options());
      tp->all_gather(all, mine_max.contiguous())->wait();
      max = all.view({size, n}).amax(0);
    } else {
      max = mine_max;
    }
  }
  auto shifted = x - max.unsqueeze(1);
  auto sum_exp = reduce_from_tp(shifted.exp().sum(1), tp);
  auto valid = targets.ne(ignore_index);
  auto here = valid & targets.ge(mine.offset) & targets.lt(mine.offset + mine.length);
  at::Tensor picked;
  if (mine.length > 0) {
    auto index = (targets - mine.offset).clamp(0, mine.length - 1).unsqueeze(1);
    picked = shifted.gather(1, index).squeeze(1) * here.to(at::kFloat);
  } else {
    picked = at::zeros({n}, x.options());
  }
  auto target_logit = reduce_from_tp(picked, tp);
  auto per_token = (sum_exp.log() - target_logit) * valid.to(at::kFloat);
  // As torch's mean reduction with ignore_index: the sum over counted tokens over their count.
  return per_token.sum() / valid.sum().to(at::kFloat);
}

}  // namespace fsdp::tp
