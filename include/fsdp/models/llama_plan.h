// Llama as the planner sees it (fsdp/tools/planner.h): the units fully_shard makes of it (the
// root: the embedding, the final norm and the head; one per decoder layer) with their parameter
// shapes, and the bytes each unit's forward keeps for backward, counted op by op for the ops
// the model's forward runs (src/models/llama/model.cpp), on the CPU kernels:
//
// Per token of a decoder layer, with d = hidden, q = heads x head_size, kv = key/value heads x
// head_size, I = intermediate, H = heads, c = bytes of the compute dtype:
//   each RMSNorm: 1/rms (4 bytes, fp32), the normalised input and the weighted output:
//     fp32: 4d + 4d; bf16/fp16: the fp32 copy of the input (4d) + the cast-back input (2d) + the
//     output (2d). Either way 8d + 4 bytes.
//   attention: the rotated q and k and v (saved by scaled_dot_product_attention: c(q + 2kv)),
//     its output and log-sum-exp (c q + 4H: the CPU flash kernel, whose output is laid out
//     [batch, seq, heads, head_size] already, so the merge for the o projection copies
//     nothing); the projections' outputs before rotation are freed.
//   the residual sum after attention, in fp32 only (4d): the post-attention norm saves it (in
//     bf16 it saves its fp32 copy instead, counted in the norm);
//   mlp: gate's output (SiLU's input), SiLU's output, up's output, their product (down's
//     input): 4 c I;
//   the layer's output, in fp32 only (4d): the next RMSNorm saves it as its input; in bf16 the
//     next norm saves its fp32 copy instead (counted there) and the bf16 output is freed.
// This is exactly the list of tensors transformers' LlamaDecoderLayer saves (listed with
// torch.autograd.graph.saved_tensors_hooks on the same shapes: the same bytes).
// Root: the embedding's output (in fp32 only, as a layer's output), cos and sin ([seq,
// head_size] each, in c, kept by the layers' rotary products), the final RMSNorm (8d + 4), the
// logits (c V) and the loss's fp32 log-probabilities (4V), which the trainer keeps through
// backward. tests/models/test_llama_plan.cpp holds these counts to the
// counting allocator (fsdp::track_host_tensor_memory) within 1%.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp/models/llama_config.h"
#include "fsdp/tools/planner.h"

namespace fsdp::models::llama {

// One step of the model: its config, seq, batch_per_rank, compute_bytes and
// activation_checkpointing (fsdp/tools/planner.h).
using PlanShape = fsdp::plan::StepShape<Config>;

// Bytes one decoder layer's forward keeps for backward, in a stack of layers (its output only
// where the next norm keeps it: fp32), for `tokens` tokens of sequences of `seq`.
int64_t layer_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int compute_bytes);
// The root's: the embedding's output, cos/sin, the final norm, the logits and the loss's
// log-probabilities.
int64_t root_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int compute_bytes);
// Short-lived tensors at the start of backward: the loss's gradients (two [tokens, vocab] fp32
// tensors while the logits' gradient is formed).
int64_t loss_transient_bytes(const Config& c, int64_t tokens);

// The root first ("(root)", kept gathered from forward to backward, as FSDP2's root), then the
// layers ("model.layers.<i>"); activation bytes for one micro-batch.
std::vector<fsdp::plan::UnitSpec> plan_units(const PlanShape& shape);

}  // namespace fsdp::models::llama
