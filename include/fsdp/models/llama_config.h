// The configuration of a Llama-family model: every field of Hugging Face's LlamaConfig that the
// forward math uses, read from and written to config.json as transformers 5.24 does.
//
// Accepted model types, because their math is Llama's exactly (transformers 5.24's modeling
// files, read line by line):
// - "llama": LlamaForCausalLM.
// - "mistral": the same layers, no biases; accepted only without a sliding window
//   ("sliding_window": null, as Mistral-7B v0.2 and v0.3 write it; MistralConfig's default when
//   the key is absent is 4096, which is rejected).
// - "qwen2": the same layers with biases on the q, k and v projections (not o), no MLP bias;
//   accepted only when no layer uses sliding-window attention (use_sliding_window false, or
//   every layer_types entry "full_attention").
// Rotary scaling types "default", "linear" and "llama3" (Llama 3.1, 3.2 and 3.3) are
// implemented (RopeScaling). Anything else that changes the math is InvalidArgument naming the
// field: another rope type (dynamic, yarn, longrope, ...), a partial rotary factor, a sliding
// window, hidden_act other than "silu", attention dropout, pretraining_tp > 1, another
// model_type (gemma, phi3, ... differ in norms or activations).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models::llama {

// How the rotary embedding's inverse frequencies inv[i] = 1 / theta^(2i / head_size) are
// rescaled for contexts longer than the pretraining one (transformers 5.24's
// modeling_rope_utils.py, computed with the same tensor operations in fp32):
// - "default": unchanged.
// - "linear": inv / factor (positions interpolated by `factor`).
// - "llama3": with wavelength w = 2 pi / inv and L = original_max_position_embeddings:
//   w < L / high_freq_factor: unchanged; w > L / low_freq_factor: inv / factor; in between
//   (1 - s) inv / factor + s inv, s = (L / w - low_freq_factor) / (high_freq_factor -
//   low_freq_factor).
struct RopeScaling {
  std::string type = "default";
  double factor = 1.0;            // linear, llama3
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // llama3: the pretraining context; config.json may omit it, then max_position_embeddings.
  int64_t original_max_position_embeddings = 0;

  bool operator==(const RopeScaling& o) const {
    return type == o.type && factor == o.factor && low_freq_factor == o.low_freq_factor &&
           high_freq_factor == o.high_freq_factor &&
           original_max_position_embeddings == o.original_max_position_embeddings;
  }
};

struct Config {
  std::string model_type = "llama";  // "llama", "mistral" or "qwen2"
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;  // grouped-query attention when fewer than the heads
  int64_t head_dim = 0;              // 0: hidden_size / num_attention_heads
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // lm_head is the embedding's tensor
  // Llama: biases on q, k, v and o. Qwen2 always has q, k, v biases and no o bias, whatever
  // this says (qkv_bias(), o_bias()).
  bool attention_bias = false;
  bool mlp_bias = false;
  std::optional<int64_t> bos_token_id = 1;
  std::vector<int64_t> eos_token_ids = {2};  // Llama 3 lists several
  std::optional<int64_t> pad_token_id;       // the embedding's padding_idx (no gradient)
  double initializer_range = 0.02;           // std of the random init
  std::string hidden_act = "silu";
  std::string dtype = "float32";  // the torch dtype config.json names ("bfloat16", ...)

  // The attention head size: head_dim when given, else hidden_size / num_attention_heads.
  int64_t head_size() const;
  int64_t q_size() const { return num_attention_heads * head_size(); }
  int64_t kv_size() const { return num_key_value_heads * head_size(); }
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return model_type != "qwen2" && attention_bias; }
  // "LlamaForCausalLM", "MistralForCausalLM" or "Qwen2ForCausalLM".
  std::string architecture() const;
};

// Throws InvalidArgument naming the field when `config` cannot be built: a size that is not
// positive, heads that do not divide hidden_size (without head_dim), key/value heads that do
// not divide the heads, an odd head size (rotary pairs), an unknown model_type or hidden_act,
// rms_norm_eps or rope_theta not positive, token ids outside the vocabulary, a rope scaling
// of another type or with factors that divide by zero (llama3: 0 < low < high frequency
// factors, original_max_position_embeddings > 0; linear and llama3: factor > 0).
void validate(const Config& config);

// Parses the text of a config.json (transformers 4 or 5). `source` names it in messages.
// The rotary parameters come, as transformers 5.24 takes them, from "rope_scaling" when it is a
// non-empty object (transformers 4's key, which Llama 3.1's files use), else from
// "rope_parameters" (transformers 5's): the type from "rope_type", else "type", else
// "default"; rope_theta from that object, else the top-level rope_theta, else 10000; llama3's
// original context from a top-level original_max_position_embeddings, else that object's, else
// max_position_embeddings. A null type or rope_theta in the object is refused (transformers
// fails on it when it builds the model);
// head_dim when present (and not null), else hidden / heads; "dtype", else "torch_dtype".
// vocab_size, hidden_size, intermediate_size, num_hidden_layers and num_attention_heads are
// required (their defaults differ between model types), num_key_value_heads too for mistral
// and qwen2; the rest takes the model type's transformers default. Throws FormatError when the
// text is not a JSON object, InvalidArgument naming the field for a missing or mistyped field,
// an unsupported feature (see the file comment) or an inconsistent config (validate()).
Config from_hf_json(const std::string& json_text, const std::string& source);
// The same from a file: `path` is config.json or a directory holding one. InvalidArgument when
// it cannot be read.
Config read_hf_config(const std::string& path);

// config.json in full, as transformers 5.24 writes it (keys sorted, 2-space indent), plus a
// top-level rope_theta next to rope_parameters, a "rope_scaling" equal to rope_parameters when
// the type is not "default", and an explicit tie_word_embeddings (mlx_lm reads only those: its
// defaults are 10000, no scaling and tied).
std::string to_hf_json(const Config& config);
// generation_config.json: bos, eos and pad token ids.
std::string to_generation_json(const Config& config);

// Published configurations, for plans and random-init runs: "llama2-7b", "llama3-8b",
// "llama3-70b", "llama3.1-8b", "llama3.2-1b" (Meta's config.json values; no weights). nullopt
// for another name.
std::optional<Config> preset_config(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace fsdp::models::llama
