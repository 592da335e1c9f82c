// MiniLLM as the planner sees it (fsdp/tools/planner.h): the units fully_shard makes of it (the
// root: embedding and head; one per block) with their parameter shapes, and the bytes each unit's
// forward keeps for backward, counted op by op for the ops model.cpp runs.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/models/minillm.h"
#include "fsdp/tools/planner.h"

namespace fsdp::models::minillm {

// One step of the model: its config, seq, batch_per_rank, compute_bytes and
// activation_checkpointing (fsdp/tools/planner.h).
using PlanShape = fsdp::plan::StepShape<Config>;

// Bytes one block's forward keeps for backward (its output included) for `tokens` tokens.
int64_t block_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int compute_bytes);
// The root's: the embedding's output and the head's logits, and the loss's log-probabilities
// (fp32), which the trainer keeps through backward.
int64_t root_activation_bytes(const Config& c, int64_t tokens, int compute_bytes);
// Short-lived tensors at the start of backward: the loss's gradients (two [tokens, vocab] fp32
// tensors while the logits' gradient is formed).
int64_t loss_transient_bytes(const Config& c, int64_t tokens);

// The root first, then the blocks; activation bytes for one micro-batch.
std::vector<fsdp::plan::UnitSpec> plan_units(const PlanShape& shape);

}  // namespace fsdp::models::minillm
