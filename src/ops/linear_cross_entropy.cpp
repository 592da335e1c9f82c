#include "fsdp/ops/linear_cross_entropy.h"

#include <torch/autograd.h>

#include <algorithm>
#include <limits>

#include "fsdp/parallel/tensor_parallel.h"
#include "ops/cross_entropy_chunk.h"
#include "util/check.h"

namespace fsdp::ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Each token's log-sum-exp over the whole vocabulary and its target's logit (fp32), when the
// vocabulary is split over a tensor-parallel group: a first pass over the chunks finds each
// rank's per-token maximum, its sum of exp() relative to that maximum and the target's logit
// where it holds the target, and one all-gather of those [3, N] floats combines them. Then the
// gradient pass uses them chunk by chunk, as the unsplit loss uses its own.
struct TokenStats {
  at::Tensor lse, target;
};

TokenStats split_vocabulary_stats(const at::Tensor& hidden, const at::Tensor& weight,
                                  const at::Tensor& index, const at::Tensor& here, int64_t chunk,
                                  const ProcessGroupPtr& tp) {
  const int64_t n = hidden.size(0), rows = weight.size(0);
  const auto f32 = hidden.options().dtype(at::kFloat);
  auto stats = at::empty({3, n}, f32);
  stats[0].fill_(-std::numeric_limits<float>::infinity());
  stats[1].zero_();
  stats[2].zero_();
  for (int64_t s = 0; rows > 0 && s < n; s += chunk) {
    const int64_t c = std::min(chunk, n - s);
    auto logits = at::mm(hidden.narrow(0, s, c), weight.t()).to(at::kFloat);
    auto max = logits.amax(1);
    stats[0].narrow(0, s, c).copy_(max);
    stats[1].narrow(0, s, c).copy_((logits - max.unsqueeze(1)).exp_().sum(1));
    stats[2].narrow(0, s, c).copy_(logits.gather(1, index.narrow(0, s, c).unsqueeze(1)).squeeze(1) *
                                   here.narrow(0, s, c).to(at::kFloat));
  }
  const int size = tp->size();
  auto all = at::empty({size * 3 * n}, stats.options().device(tp->device()));
  tp->all_gather(all, stats.reshape(-1).to(tp->device()))->wait();
  all = all.view({size, 3, n}).to(hidden.device());
  auto max = all.select(1, 0).amax(0);
  // A rank without rows contributes exp(-inf) = 0; every token has a finite maximum somewhere.
  auto sum = (all.select(1, 1) * (all.select(1, 0) - max.unsqueeze(0)).exp()).sum(0);
  return {max + sum.log(), all.select(1, 2).sum(0)};
}

class LinearCrossEntropyFunction : public torch::autograd::Function<LinearCrossEntropyFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden_in,
                            const at::Tensor& weight, const at::Tensor& targets,
                            const LinearCrossEntropyOptions& o) {
    const auto hidden = hidden_in.contiguous();
    const int64_t n = hidden.size(0), rows = weight.size(0);
    const bool split = o.tp && o.tp->size() > 1;
    // The kernel keeps nothing but the GEMM's logits (in hidden's dtype) per chunk; a split
    // vocabulary's first pass (split_vocabulary_stats) is ATen's, with float32 copies.
    const bool in_place = !split && rows > 0 && detail::chunk_kernel_runs_on(hidden);
    const int64_t chunk = linear_cross_entropy_chunk(n, hidden.size(1), rows, o,
                                                     in_place ? hidden.element_size() : 4);
    const bool want_h = hidden_in.requires_grad(), want_w = weight.requires_grad();
    auto valid = targets.ne(o.ignore_index);
    // 1 / count on the device: scaling needs no host sync.
    auto inv_count = valid.sum().clamp_min(1).to(at::kFloat).reciprocal();
    auto here = valid & targets.ge(o.vocab_offset) & targets.lt(o.vocab_offset + rows);
    auto index = (targets - o.vocab_offset).clamp(0, std::max<int64_t>(rows - 1, 0));
    TokenStats stats;
    if (split) stats = split_vocabulary_stats(hidden, weight, index, here, chunk, o.tp);

    auto loss_sum = at::zeros({}, hidden.options().dtype(at::kFloat));
    at::Tensor grad_h = want_h ? at::empty_like(hidden) : at::Tensor();
    at::Tensor grad_w =
        want_w ? at::zeros(weight.sizes(), weight.options().dtype(at::kFloat)) : at::Tensor();
    const bool want_grad = want_h || want_w;
    for (int64_t s = 0; s < n; s += chunk) {
      const int64_t c = std::min(chunk, n - s);
      auto h = hidden.narrow(0, s, c);
      detail::ChunkRows r;
      r.index = index.narrow(0, s, c);
      r.here = here.narrow(0, s, c);
      r.counted = valid.narrow(0, s, c);
      r.inv_count = inv_count;
      if (split) {
        r.lse = stats.lse.narrow(0, s, c);
        r.target = stats.target.narrow(0, s, c);
      }
      // The chunk's logits in hidden's dtype (a bf16 GEMM under bf16 compute); a rank of a split
      // vocabulary may hold no rows.
      auto logits = rows > 0 ? at::mm(h, weight.t()) : at::empty({c, 0}, hidden.options());
      auto part = detail::chunk_cross_entropy(logits, r, want_grad);
      loss_sum += part.loss_sum;
      if (!want_grad) continue;
      if (want_h) {
        auto rows_of_h = grad_h.narrow(0, s, c);
        at::mm_out(rows_of_h, part.grad, weight);
      }
      if (want_w) detail::accumulate_weight_grad(grad_w, part.grad, h);
    }
    ctx->saved_data["grad_h"] = grad_h;
    ctx->saved_data["grad_w"] = grad_w;
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return loss_sum * inv_count;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const auto& g = grad_outputs[0];  // a scalar: 1 for loss.backward(), a scale otherwise
    auto grad_h = ctx->saved_data["grad_h"].toTensor();
    auto grad_w = ctx->saved_data["grad_w"].toTensor();
    const auto weight_dtype = static_cast<at::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    at::Tensor dh, dw;
    if (grad_h.defined()) dh = grad_h * g.to(grad_h.scalar_type());
    if (grad_w.defined()) dw = (grad_w * g.to(at::kFloat)).to(weight_dtype);
    return {dh, dw, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

int64_t linear_cross_entropy_chunk(int64_t tokens, int64_t hidden, int64_t vocab,
                                   const LinearCrossEntropyOptions& options, int64_t logit_bytes) {
  FSDP_CHECK_ARG(options.chunk_tokens >= 0,
                 "linear_cross_entropy: chunk_tokens must be >= 0 (0: automatic), got {}",
                 options.chunk_tokens);
  FSDP_CHECK_ARG(logit_bytes >= 1 && logit_bytes <= 8,
                 "linear_cross_entropy_chunk: logit_bytes must be 1 to 8, got {}", logit_bytes);
  if (tokens <= 0) return 1;
  if (options.chunk_tokens > 0) return std::min(options.chunk_tokens, tokens);
  // Liger-Kernel's rule: about tokens * hidden / vocab rows, a power of two; but at least as many
  // rows as 256 MiB of logits hold (a power of two; float32 for the ATen form), because every
  // chunk also adds its part to the whole [vocab, hidden] weight gradient: with a small hidden
  // size Liger's chunks are a few tokens, and that traffic made a step 4x slower on the CPU
  // (vocab 128256, hidden 256); on a GPU each chunk reads and writes the float32 sum (1 GiB at
  // Llama-3.2-1B's head).
  const int64_t factor = std::max<int64_t>(1, (vocab + hidden - 1) / std::max<int64_t>(hidden, 1));
  const int64_t want = (tokens + factor - 1) / factor;
  int64_t chunk = 1;
  while (chunk < want) chunk *= 2;
  const int64_t budget = (int64_t{256} << 20) / (logit_bytes * std::max<int64_t>(vocab, 1));
  int64_t floor_rows = 1;
  while (floor_rows * 2 <= budget) floor_rows *= 2;
  return std::min(std::max(chunk, floor_rows), tokens);
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight,
                                const at::Tensor& targets,
                                const LinearCrossEntropyOptions& options) {
  FSDP_CHECK_ARG(hidden.dim() == 2 && weight.dim() == 2 && targets.dim() == 1 &&
                     hidden.size(0) == targets.size(0) && hidden.size(1) == weight.size(1),
                 "linear_cross_entropy: expected hidden [N, d], weight [V, d] and targets [N], "
                 "got {}, {} and {}",
                 hidden.sizes(), weight.sizes(), targets.sizes());
  FSDP_CHECK_ARG(hidden.is_floating_point() && weight.scalar_type() == hidden.scalar_type() &&
                     targets.scalar_type() == at::kLong,
                 "linear_cross_entropy: expected floating hidden states, a weight of their dtype "
                 "and int64 targets, got {}, {} and {}",
                 c10::toString(hidden.scalar_type()), c10::toString(weight.scalar_type()),
                 c10::toString(targets.scalar_type()));
  FSDP_CHECK_ARG(hidden.device() == weight.device() && hidden.device() == targets.device(),
                 "linear_cross_entropy: hidden ({}), weight ({}) and targets ({}) must share a "
                 "device",
                 hidden.device().str(), weight.device().str(), targets.device().str());
  const int size = options.tp ? options.tp->size() : 1;
  const int64_t vocab = options.tp ? options.vocab : weight.size(0);
  if (options.tp) {
    const auto mine = tp::chunk_of(options.vocab, size, options.tp->rank());
    FSDP_CHECK_ARG(mine.offset == options.vocab_offset && mine.length == weight.size(0),
                   "linear_cross_entropy: rank {} of {} holds rows [{}, {}) of the weight; its "
                   "chunk of a vocabulary of {} is [{}, {})",
                   options.tp->rank(), size, options.vocab_offset,
                   options.vocab_offset + weight.size(0), options.vocab, mine.offset,
                   mine.offset + mine.length);
  } else {
    FSDP_CHECK_ARG(options.vocab_offset == 0 && (options.vocab == 0 || options.vocab == vocab),
                   "linear_cross_entropy: without a tensor-parallel group the weight holds the "
                   "whole vocabulary (offset 0, {} rows), got offset {} of {}",
                   weight.size(0), options.vocab_offset, options.vocab);
  }
  // Targets are the same on every rank of a TP group, so every rank reaches the same verdict.
  const auto in_range =
      (((targets >= 0) & (targets < vocab)) | targets.eq(options.ignore_index)).all();
  if (in_range.device().is_cpu()) {
    FSDP_CHECK_ARG(in_range.item<bool>(),
                   "linear_cross_entropy: a target is outside the vocabulary [0, {}) and is not "
                   "the ignore index {}",
                   vocab, options.ignore_index);
  } else {
    at::_assert_async(in_range,
                      "linear_cross_entropy: a target is outside the vocabulary and is not the "
                      "ignore index");
  }
  return LinearCrossEntropyFunction::apply(hidden, weight, targets, options);
}

}  // namespace fsdp::ops
