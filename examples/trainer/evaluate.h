// Validation loss: the mean next-token cross-entropy over every counted prediction of every
// window (targets of -100, left out by a loss mask, are not counted), the windows split over the
// ranks (contiguous shares). Collective.
#pragma once

#include <functional>

#include "data.h"
#include "fsdp/fsdp.h"

namespace trainer {

using LogitsFn = std::function<torch::Tensor(const torch::Tensor& tokens)>;
// The mean cross-entropy of targets [B, L] under logits from a LogitsFn (a model's own loss:
// vocabulary-parallel under tensor parallelism). Null: cross-entropy over whole logits.
using LossFn =
    std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& targets)>;

// Which part of the data a rank sees: its data-parallel index among `count` (the tensor-parallel
// ranks of one data-parallel rank see the same windows and batches).
struct DataShare {
  int index = 0;
  int count = 1;
};

// Every rank runs the same number of forwards (ranks with fewer windows repeat one and ignore
// it), since each forward's gathers are collectives. Runs without grad mode. The windows are
// split over `share`; the sums are combined over `world` (each share counted by its TP ranks
// alike, which leaves the mean as it is).
double validation_loss(const Windows& windows, const LogitsFn& logits, int64_t vocab,
                       int64_t per_forward, fsdp::ProcessGroup& world, const c10::Device& device,
                       const LossFn& loss = nullptr, DataShare share = {-1, 0});

}  // namespace trainer
