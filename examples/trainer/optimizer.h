// The optimizer of every trainer: AdamW (fsdp::FusedAdamW or libtorch's), weight decay on
// parameters of 2 or more dimensions only (norms and biases get none: two param groups, decay
// first), and the learning rate schedule.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>

#include "train_options.h"

namespace trainer {

// Over `module`'s parameters (this rank's shards, each tensor once).
std::unique_ptr<torch::optim::Optimizer> make_optimizer(const TrainOptions& o,
                                                        const torch::nn::Module& module);

// The learning rate of step `step` (0-based) of o.steps: linear warmup over o.warmup steps
// (lr * (step + 1) / warmup), then o.lr, or a cosine from o.lr down to o.lr_min at the last step.
double lr_at(const TrainOptions& o, int step);

// Sets every param group's learning rate.
void set_lr(torch::optim::Optimizer& opt, double lr);

}  // namespace trainer
