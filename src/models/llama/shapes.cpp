// The Llama model's parameters by name and shape without building it (llama.h): their
// tensor-parallel slices, count and training FLOPs, for loaders, planners and the trainer.
#include <map>
#include <string>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "model_check.h"

namespace fsdp::models::llama {

std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const Config& c) {
  validate(c);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  const int64_t d = c.hidden_size, q = c.q_size(), kv = c.kv_size(), i = c.intermediate_size;
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, d}});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto linear = [&](const std::string& name, int64_t in, int64_t rows, bool bias) {
      out.push_back({p + name + ".weight", {rows, in}});
      if (bias) out.push_back({p + name + ".bias", {rows}});
    };
    linear("self_attn.q_proj", d, q, c.qkv_bias());
    linear("self_attn.k_proj", d, kv, c.qkv_bias());
    linear("self_attn.v_proj", d, kv, c.qkv_bias());
    linear("self_attn.o_proj", q, d, c.o_bias());
    linear("mlp.gate_proj", d, i, c.mlp_bias);
    linear("mlp.up_proj", d, i, c.mlp_bias);
    linear("mlp.down_proj", i, d, c.mlp_bias);
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
  }
  out.push_back({"model.norm.weight", {d}});
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {c.vocab_size, d}});
  return out;
}

void validate_tp(const Config& c, int tp_size) {
  FSDP_MODEL_CHECK(tp_size >= 1, "llama: the tensor-parallel degree must be positive, got {}",
                   tp_size);
  FSDP_MODEL_CHECK(c.num_attention_heads % tp_size == 0 && c.num_key_value_heads % tp_size == 0,
                   "llama: a tensor-parallel degree of {} must divide the attention heads ({}) and "
                   "the key/value heads ({}): each rank computes whole heads",
                   tp_size, c.num_attention_heads, c.num_key_value_heads);
}

std::map<std::string, tp::TpSlice> tp_slices(const Config& c, int tp_size, int tp_rank) {
  validate_tp(c, tp_size);
  std::map<std::string, tp::TpSlice> out;
  if (tp_size == 1) return out;
  auto add = [&](const std::string& name, const std::vector<int64_t>& full, int64_t dim) {
    out[name] = tp::TpSlice{dim, tp::chunk_of(full[dim], tp_size, tp_rank), full};
  };
  for (const auto& [name, shape] : parameter_shapes(c)) {
    auto ends_with = [&](const std::string& suffix) {
      return name.size() >= suffix.size() &&
             name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    const bool row = ends_with("o_proj.weight") || ends_with("down_proj.weight");
    const bool whole = ends_with("norm.weight") || ends_with("layernorm.weight") ||
                       ends_with("o_proj.bias") || ends_with("down_proj.bias");
    if (row) {
      add(name, shape, 1);
    } else if (!whole) {
      add(name, shape, 0);  // column-parallel weights and biases, the embedding, the head
    }
  }
  return out;
}

tp::Layout tp_layout(const Config& c, const ProcessGroupPtr& tp, const ProcessGroupPtr& dp) {
  if (!tp || tp->size() == 1) return {};
  return tp::Layout{tp, tp_slices(c, tp->size(), tp->rank()), dp};
}

std::vector<std::string> parameter_names(const Config& c) {
  std::vector<std::string> names;
  for (auto& [name, shape] : parameter_shapes(c)) names.push_back(name);
  return names;
}

int64_t parameter_count(const Config& c) {
  int64_t n = 0;
  for (const auto& [name, shape] : parameter_shapes(c)) {
    int64_t numel = 1;
    for (auto s : shape) numel *= s;
    n += numel;
  }
  return n;
}

double train_flops_per_token(const Config& c, int64_t seq) {
  const double d = c.hidden_size, q = c.q_size(), kv = c.kv_size(), i = c.intermediate_size;
  const double layer = d * q + 2 * d * kv + q * d + 3 * d * i;
  const double matmul_params = c.num_hidden_layers * layer + static_cast<double>(c.vocab_size) * d;
  return 6.0 * matmul_params + 12.0 * c.num_hidden_layers * q * seq;
}

}  // namespace fsdp::models::llama
