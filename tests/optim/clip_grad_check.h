// The check shared by the thread-rank and MPI clipping tests: on this rank of `pg`, gradients of
// the harness model's global batch, clipped by fsdp::clip_grad_norm_ to a quarter of their norm,
// equal the unsharded model's clipped by torch::nn::utils::clip_grad_norm_ (total norm and
// every gathered gradient within 1e-5 relative). Every rank of `pg` must call it.
#pragma once

#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include "support/train_harness.h"

namespace fsdp::testing {

inline void expect_clip_grad_matches_libtorch(const ProcessGroupPtr& pg, double p) {
  TrainSpec spec;
  auto [tokens, targets] = global_batch(spec, 0);
  const int64_t classes = spec.model.output_size();
  auto ref = build_model(spec);
  loss_of(ref(tokens), targets, classes).backward();
  const double unclipped = torch::nn::utils::clip_grad_norm_(ref->parameters(), 1e9, p);
  const double max_norm = unclipped / 4;  // clipping must happen
  const double want = torch::nn::utils::clip_grad_norm_(ref->parameters(), max_norm, p);
  auto ref_params = ref->named_parameters();

  auto model = build_model(spec);
  auto root = shard_model(model, pg);
  const int64_t per_rank = spec.batch / pg->size();
  loss_of(root(rank_slice(tokens, pg, per_rank)), rank_slice(targets, pg, per_rank), classes)
      .backward();
  const double got = clip_grad_norm_(root->parameters(), max_norm, pg, p);
  EXPECT_NEAR(got, want, 1e-5 * want) << "world " << pg->size() << " p " << p;
  for (const auto& item : model->named_parameters()) {
    const auto& full_want = ref_params[item.key()].grad();
    auto full_got = gather_full(pg, item.value().grad(), full_want.size(0));
    double scale = std::max(full_want.abs().max().item<double>(), 1e-12);
    EXPECT_LT((full_got - full_want).abs().max().item<double>() / scale, 1e-5)
        << item.key() << " world " << pg->size() << " p " << p;
  }
}

}  // namespace fsdp::testing
