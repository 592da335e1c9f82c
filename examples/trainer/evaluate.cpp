#include "evaluate.h"

#include <torch/nn/functional/loss.h>

#include <algorithm>

namespace trainer {

double validation_loss(const Windows& windows, const LogitsFn& logits, int64_t vocab,
                       int64_t per_forward, fsdp::ProcessGroup& world, const c10::Device& device,
                       const LossFn& loss_fn, DataShare share) {
  torch::NoGradGuard no_grad;
  const int64_t total = windows.count();
  if (share.count == 0) share = {world.rank(), world.size()};  // every rank its own share
  const int ranks = share.count;
  // Share r's contiguous windows: the first total % ranks shares take one more.
  const int64_t base = total / ranks, extra = total % ranks;
  const int r = share.index;
  const int64_t first = r * base + std::min<int64_t>(r, extra);
  const int64_t mine = base + (r < extra ? 1 : 0);
  const int64_t most = base + (extra > 0 ? 1 : 0);
  const int64_t forwards = (most + per_forward - 1) / per_forward;
  double sum = 0;
  int64_t predictions = 0;
  for (int64_t f = 0; f < forwards; ++f) {
    const int64_t begin = f * per_forward;
    const int64_t n = std::max<int64_t>(0, std::min(per_forward, mine - begin));
    // A rank out of windows still joins the forward's gathers, on a window it ignores.
    auto batch = n > 0 ? windows.windows(first + begin, n) : windows.windows(0, 1);
    auto out = logits(batch.tokens.to(device));
    // Targets a loss mask leaves out are -100 (not counted, as transformers' labels).
    const int64_t counted = (batch.targets != -100).sum().item<int64_t>();
    if (loss_fn) {
      // Collective under tensor parallelism: every rank computes it, even on an ignored window
      // (a window with no counted target gives NaN, not used).
      auto mean = loss_fn(out, batch.targets.to(device));
      if (n == 0 || counted == 0) continue;
      // The mean over the counted targets times their count is their sum.
      sum += mean.item<double>() * static_cast<double>(counted);
    } else {
      if (n == 0 || counted == 0) continue;
      auto loss = torch::nn::functional::cross_entropy(
          out.to(torch::kFloat).reshape({-1, vocab}), batch.targets.to(device).reshape(-1),
          torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
      sum += loss.item<double>();
    }
    predictions += counted;
  }
  auto totals = torch::tensor({sum, static_cast<double>(predictions)},
                              torch::dtype(torch::kDouble).device(world.device()));
  world.all_reduce(totals, fsdp::ReduceOp::kSum)->wait();
  auto t = totals.cpu();
  return t[0].item<double>() / t[1].item<double>();
}

}  // namespace trainer
