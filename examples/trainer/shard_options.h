// fully_shard's options as the loop's flags give them: --dtype's mixed precision, --offload
// all's CPU offload, and for a block (not the root) --no-reshard-after-forward and
// --activation-checkpointing. Both trainers shard with these.
#pragma once

#include "fsdp/fsdp.h"
#include "train_options.h"

namespace trainer {

inline fsdp::FullyShardOptions shard_options(const TrainOptions& o, bool block) {
  fsdp::FullyShardOptions opts;
  if (o.dtype == Dtype::bf16) {
    opts.mp_policy.param_dtype = torch::kBFloat16;
    opts.mp_policy.reduce_dtype = torch::kFloat;
  }
  if (o.offload == Offload::all) opts.offload_policy = fsdp::CPUOffloadPolicy{};
  if (block) {
    opts.reshard_after_forward = o.reshard_after_forward;
    opts.activation_checkpointing = o.activation_checkpointing;
  }
  return opts;
}

}  // namespace trainer
