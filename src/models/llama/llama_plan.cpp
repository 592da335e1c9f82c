// Llama's units for the planner (llama_plan.h: the count, op by op).
#include "fsdp/models/llama_plan.h"

#include <string>

#include "fsdp/models/llama.h"

namespace fsdp::models::llama {
namespace {

// One RMSNorm per token: 1/rms in fp32 plus 8 bytes per element of the width (llama_plan.h).
int64_t norm_bytes_per_token(const Config& c) { return 8 * c.hidden_size + 4; }

// A hidden state handed to the next RMSNorm: kept in fp32 (the norm saves its input itself);
// in bf16/fp16 the norm saves an fp32 copy instead (counted in the norm) and the state is freed.
int64_t output_bytes_per_token(const Config& c, int cb) { return cb == 4 ? 4 * c.hidden_size : 0; }

fsdp::plan::ParamShape shape_of(const std::vector<int64_t>& shape) {
  int64_t row = 1;
  for (size_t i = 1; i < shape.size(); ++i) row *= shape[i];
  return {shape.empty() ? 1 : shape[0], row};
}

}  // namespace

int64_t layer_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int cb) {
  (void)seq;  // the flash kernel keeps nothing of size seq x seq
  const int64_t q = c.q_size(), kv = c.kv_size(), i = c.intermediate_size;
  const int64_t per_token = 2 * norm_bytes_per_token(c)           // input and post-attention norms
                            + cb * (q + 2 * kv)                   // rotated q, k; v
                            + cb * q + 4 * c.num_attention_heads  // attention output, log-sum-exp
                            + output_bytes_per_token(c, cb)       // the residual sum
                            + 4 * cb * i                          // gate, SiLU, up, product
                            + output_bytes_per_token(c, cb);      // the layer's output
  return tokens * per_token;
}

int64_t root_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int cb) {
  // cos and sin live as long as a layer's rotary products keep them: with no layers, not at all.
  const int64_t rotary = c.num_hidden_layers > 0 ? 2 * seq * c.head_size() * cb : 0;
  return tokens *
             (output_bytes_per_token(c, cb) + norm_bytes_per_token(c) + c.vocab_size * (cb + 4)) +
         rotary;
}

int64_t loss_transient_bytes(const Config& c, int64_t tokens) {
  return 2 * tokens * c.vocab_size * 4;
}

std::vector<fsdp::plan::UnitSpec> plan_units(const PlanShape& s) {
  validate_tp(s.model, s.tp);
  // Under tensor parallelism a rank computes its heads, its part of the MLP and of the
  // vocabulary (TP rank 0's chunks, the largest); norms and residuals stay whole.
  Config c = s.model;
  if (s.tp > 1) {
    c.head_dim = s.model.head_size();
    c.num_attention_heads /= s.tp;
    c.num_key_value_heads /= s.tp;
    c.intermediate_size = tp::chunk_of(c.intermediate_size, s.tp, 0).length;
    c.vocab_size = tp::chunk_of(c.vocab_size, s.tp, 0).length;
  }
  const auto slices = tp_slices(s.model, s.tp, 0);
  const int64_t tokens = s.batch_per_rank * s.seq;
  // Each layer's o and down outputs are summed over the group (the embedding's lookup in the
  // root), [tokens, hidden] in the compute dtype.
  const int tp_per_layer = s.tp > 1 ? 2 : 0;
  const int64_t tp_bytes = tokens * s.model.hidden_size * s.compute_bytes;
  std::vector<fsdp::plan::UnitSpec> units(1);
  units[0].name = "(root)";
  units[0].activation_bytes = root_activation_bytes(c, tokens, s.seq, s.compute_bytes);
  units[0].reshard_after_forward = false;
  units[0].tp_all_reduces = s.tp > 1 ? 1 : 0;
  units[0].tp_all_reduce_bytes = tp_bytes;
  const std::string layer_prefix = "model.layers.";
  for (auto [name, shape] : parameter_shapes(s.model)) {
    if (auto it = slices.find(name); it != slices.end())
      shape[it->second.dim] = it->second.chunk.length;
    if (name.compare(0, layer_prefix.size(), layer_prefix) != 0) {
      units[0].params.push_back(shape_of(shape));  // the embedding, the final norm, the head
      continue;
    }
    const auto dot = name.find('.', layer_prefix.size());
    const std::string unit = name.substr(0, dot);
    if (units.back().name != unit) {
      fsdp::plan::UnitSpec layer;
      layer.name = unit;
      layer.activation_bytes = layer_activation_bytes(c, tokens, s.seq, s.compute_bytes);
      layer.checkpointed = s.activation_checkpointing;
      layer.checkpoint_input_bytes = tokens * c.hidden_size * s.compute_bytes;
      layer.tp_all_reduces = tp_per_layer;
      layer.tp_all_reduce_bytes = tp_bytes;
      units.push_back(layer);
    }
    units.back().params.push_back(shape_of(shape));
  }
  return units;
}

}  // namespace fsdp::models::llama
