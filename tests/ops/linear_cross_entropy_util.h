// What the tests of ops::linear_cross_entropy share (test_linear_cross_entropy.cpp on the CPU,
// test_linear_cross_entropy_cuda.cpp on a GPU): a case, the unfused head and loss it is held to
// (at::linear, then cross_entropy on float32 logits), the fused loss's run, and the
// vocabulary-parallel run on thread ranks. Each run starts from copies of the case's tensors;
// the weight gets a gradient when the case's weight requires one.
#pragma once

#include <algorithm>
#include <thread>
#include <vector>

#include "fsdp/comm/local_group.h"
#include "fsdp/ops/linear_cross_entropy.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "support/tensor_compare.h"
#include "support/torch_api.h"

namespace fsdp::testing::lce {

struct Case {
  at::Tensor hidden, weight, targets;
};

struct Result {
  at::Tensor loss, grad_h, grad_w;
};

inline Result unfused(const Case& c) {
  auto h = c.hidden.detach().clone().requires_grad_();
  auto w = c.weight.detach().clone().requires_grad_(c.weight.requires_grad());
  auto loss = torch::nn::functional::cross_entropy(
      torch::nn::functional::linear(h, w).to(at::kFloat), c.targets);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

inline Result fused(const Case& c, const ops::LinearCrossEntropyOptions& o = {}) {
  auto h = c.hidden.detach().clone().requires_grad_();
  auto w = c.weight.detach().clone().requires_grad_(c.weight.requires_grad());
  auto loss = ops::linear_cross_entropy(h, w, c.targets, o);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

// The vocabulary split over `world` thread ranks (CPU groups: the loss moves its per-token
// statistics to the group's device and back), each rank's weight rows tp::chunk_of's, chunks of
// `chunk_tokens`: each rank's result (its loss, its share of the hidden states' gradient and its
// rows of the weight's).
inline std::vector<Result> vocabulary_parallel(const Case& c, int64_t vocab, int world,
                                               int64_t chunk_tokens) {
  auto groups = make_local_groups(world);
  std::vector<Result> got(world);
  std::vector<std::thread> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      const auto mine = tp::chunk_of(vocab, world, r);
      Case local{c.hidden, c.weight.detach().narrow(0, mine.offset, mine.length).clone(),
                 c.targets};
      local.weight.requires_grad_(c.weight.requires_grad());
      ops::LinearCrossEntropyOptions o;
      o.tp = groups[r];
      o.vocab_offset = mine.offset;
      o.vocab = vocab;
      o.chunk_tokens = chunk_tokens;
      got[r] = fused(local, o);
    });
  }
  for (auto& t : ranks) t.join();
  return got;
}

}  // namespace fsdp::testing::lce
