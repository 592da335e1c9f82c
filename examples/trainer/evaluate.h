// Validation loss: the mean next-token cross-entropy over every prediction of every window,
// the windows split over the ranks (contiguous shares). Collective.
#pragma once

#include <functional>

#include "data.h"
#include "fsdp/fsdp.h"

namespace trainer {

using LogitsFn = std::function<torch::Tensor(const torch::Tensor& tokens)>;

// Every rank runs the same number of forwards (ranks with fewer windows repeat one and ignore
// it), since each forward's gathers are collectives. Runs without grad mode.
double validation_loss(const Windows& windows, const LogitsFn& logits, int64_t vocab,
                       int64_t per_forward, fsdp::ProcessGroup& world, const c10::Device& device);

}  // namespace trainer
