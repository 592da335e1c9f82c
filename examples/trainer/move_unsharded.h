// Moving the rest of a model whose blocks are sharded already (the root's own parameters, its
// buffers) to the training device. Module::to would move every parameter of the tree, shards
// included: under CPU offload that copies every host shard to the device (the library adopts the
// copies back at the next gather, but the device holds the whole model meanwhile).
#pragma once

#include <torch/nn/module.h>
#include <torch/utils.h>

#include "fsdp/runtime/sharded_tensor.h"

namespace trainer {

inline void move_unsharded(torch::nn::Module& module, const c10::Device& device) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.parameters(/*recurse=*/true)) {
    if (!fsdp::shard_of(p) && p.device() != device) p.set_data(p.to(device));
  }
  for (auto& b : module.buffers(/*recurse=*/true)) {
    if (b.device() != device) b.set_data(b.to(device));
  }
}

}  // namespace trainer
