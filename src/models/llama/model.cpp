// The Llama modules (llama.h). Each forward follows transformers 5.24's modeling_llama.py op for
// op, in the same order and with the same kernels, so that logits agree to rounding (measured
// by tests/reference/llama_logits_check.py).
#include <fmt/ranges.h>

#include <cmath>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "model_check.h"

namespace fsdp::models::llama {
namespace {

// A weight drawn from normal(0, std) in fp32 and cast, so the values do not depend on the
// parameters' dtype beyond that cast; or uninitialised when a load will overwrite it.
torch::Tensor init_weight(torch::IntArrayRef shape, double std, const BuildOptions& o) {
  if (!o.random_init) return torch::empty(shape, torch::TensorOptions().dtype(o.dtype));
  auto t = torch::empty(shape, torch::kFloat);
  t.normal_(0.0, std);
  return t.to(o.dtype);
}

torch::TensorOptions options_of(const BuildOptions& o) {
  return torch::TensorOptions().dtype(o.dtype);
}

// transformers' rotate_half: the two halves of the last dimension, (-x2, x1).
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
}

// sdpa_attention_forward's repeat_kv: [b, kv, s, d] -> [b, kv * n, s, d], each head n times.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n) {
  if (n == 1) return x;
  const auto b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n, s, d}).reshape({b, kv * n, s, d});
}

}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, double std, const BuildOptions& o) {
  weight = register_parameter("weight", init_weight({out, in}, std, o));
  if (with_bias) bias = register_parameter("bias", torch::zeros({out}, options_of(o)));
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  return torch::nn::functional::linear(x, weight, bias);
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, std::optional<int64_t> padding_idx,
                             double std, const BuildOptions& o)
    : padding_idx_(padding_idx.value_or(-1)) {
  auto w = init_weight({vocab, dim}, std, o);
  // nn.Embedding and HF's _init_weights zero the padding row.
  if (padding_idx && o.random_init) w[*padding_idx].zero_();
  weight = register_parameter("weight", w);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  return torch::embedding(weight, tokens, padding_idx_, /*scale_grad_by_freq=*/false,
                          /*sparse=*/false);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, const BuildOptions& o) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}, options_of(o)));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // LlamaRMSNorm.forward, not torch::rms_norm: the variance in fp32 and the weight applied
  // after the cast back, which rounds differently in bf16.
  const auto input_dtype = x.scalar_type();
  auto h = x.to(torch::kFloat);
  auto variance = h.pow(2).mean(-1, /*keepdim=*/true);
  h = h * torch::rsqrt(variance + eps_);
  return weight * h.to(input_dtype);
}

namespace {

// The rotary inverse frequencies, fp32 on the CPU (transformers makes the buffer at
// construction), with the operations transformers 5.24's modeling_rope_utils.py applies, in its
// order, so that the values are the same bits. Python's `s / t` for a number s is
// t.reciprocal() * s (Tensor.__rdiv__), and `s - t` is rsub(t, s).
torch::Tensor rotary_inverse_frequencies(const Config& c) {
  const int64_t dim = c.head_size();
  // compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2, float) / dim)).
  auto exponent = torch::arange(0, dim, 2, torch::kFloat) / dim;
  auto inv_freq = torch::pow(c.rope_theta, exponent).reciprocal();
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") return inv_freq / r.factor;  // _compute_linear_scaling_rope_parameters
  if (r.type != "llama3") return inv_freq;
  // _compute_llama3_parameters.
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (wavelen.reciprocal() * old_context - r.low_freq_factor) /
                (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = torch::rsub(smooth, 1) * scaled / r.factor + smooth * scaled;
  auto medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

// LlamaRotaryEmbedding.forward from the frequencies on the activations' device:
// position_ids[..., None].float() * inv_freq, in fp32; attention_scaling is 1.0 for the
// implemented types (a multiplication that changes nothing).
std::pair<torch::Tensor, torch::Tensor> cos_sin_of(const torch::Tensor& inv_freq, int64_t seq,
                                                   torch::ScalarType dtype) {
  auto positions = torch::arange(seq, torch::TensorOptions(torch::kLong).device(inv_freq.device()));
  auto freqs = positions.unsqueeze(0).unsqueeze(-1).to(torch::kFloat) * inv_freq;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

}  // namespace

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const Config& c, int64_t seq,
                                                       torch::ScalarType dtype,
                                                       torch::Device device) {
  return cos_sin_of(rotary_inverse_frequencies(c).to(device), seq, dtype);
}

AttentionImpl::AttentionImpl(const Config& c, const BuildOptions& o)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_size_(c.head_size()) {
  const double std = c.initializer_range;
  q_proj = register_module("q_proj", Linear(c.hidden_size, c.q_size(), c.qkv_bias(), std, o));
  k_proj = register_module("k_proj", Linear(c.hidden_size, c.kv_size(), c.qkv_bias(), std, o));
  v_proj = register_module("v_proj", Linear(c.hidden_size, c.kv_size(), c.qkv_bias(), std, o));
  o_proj = register_module("o_proj", Linear(c.q_size(), c.hidden_size, c.o_bias(), std, o));
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t batch = x.size(0), seq = x.size(1);
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({batch, seq, -1, head_size_}).transpose(1, 2);
  };
  auto q = heads_first(q_proj(x));
  auto k = heads_first(k_proj(x));
  auto v = heads_first(v_proj(x));
  // apply_rotary_pos_emb(unsqueeze_dim=1)
  const auto c = cos.unsqueeze(1), s = sin.unsqueeze(1);
  q = (q * c) + (rotate_half(q) * s);
  k = (k * c) + (rotate_half(k) * s);
  // sdpa_attention_forward on CPU: grouped-query attention inside the kernel when the head size
  // is at most 256 (use_gqa_in_sdpa), else the key/value heads repeated; causal from 2 tokens.
  const int64_t groups = heads_ / kv_heads_;
  const bool gqa = groups > 1 && head_size_ <= 256;
  if (groups > 1 && !gqa) {
    k = repeat_kv(k, groups);
    v = repeat_kv(v, groups);
  }
  const double scale = std::pow(static_cast<double>(head_size_), -0.5);
  auto out = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                              /*is_causal=*/seq > 1, scale, /*enable_gqa=*/gqa);
  out = out.transpose(1, 2).contiguous().reshape({batch, seq, -1});
  return o_proj(out);
}

MLPImpl::MLPImpl(const Config& c, const BuildOptions& o) {
  const double std = c.initializer_range;
  const int64_t d = c.hidden_size, i = c.intermediate_size;
  gate_proj = register_module("gate_proj", Linear(d, i, c.mlp_bias, std, o));
  up_proj = register_module("up_proj", Linear(d, i, c.mlp_bias, std, o));
  down_proj = register_module("down_proj", Linear(i, d, c.mlp_bias, std, o));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return down_proj(torch::silu(gate_proj(x)) * up_proj(x));
}

DecoderLayerImpl::DecoderLayerImpl(const Config& c, const BuildOptions& o) {
  // transformers' registration order, which is named_parameters()'s.
  self_attn = register_module("self_attn", Attention(c, o));
  mlp = register_module("mlp", MLP(c, o));
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, o));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps, o));
}

torch::Tensor DecoderLayerImpl::forward(const torch::Tensor& x, const torch::Tensor& cos,
                                        const torch::Tensor& sin) {
  auto h = x + self_attn(input_layernorm(x), cos, sin);
  return h + mlp(post_attention_layernorm(h));
}

LlamaModelImpl::LlamaModelImpl(const Config& c, const BuildOptions& o)
    : config_(c), inv_freq_(rotary_inverse_frequencies(c)) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size,
                                                           c.pad_token_id, c.initializer_range, o));
  auto list = register_module("layers", torch::nn::ModuleList());
  layers.reserve(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DecoderLayer layer(c, o);
    list->push_back(layer);
    layers.push_back(layer);
    if (o.on_layer_built) o.on_layer_built(i, layers.back());
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, o));
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& tokens) {
  FSDP_MODEL_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                   "llama: tokens must be [batch, seq] int64, got {} {}",
                   c10::toString(tokens.scalar_type()), tokens.sizes().vec());
  auto h = embed_tokens(tokens);
  // Moved once, at the first forward on a device, not copied in every step.
  if (inv_freq_.device() != h.device()) inv_freq_ = inv_freq_.to(h.device());
  auto [cos, sin] = cos_sin_of(inv_freq_, tokens.size(1), h.scalar_type());
  for (auto& layer : layers) h = layer(h, cos, sin);
  return norm(h);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, const BuildOptions& o)
    : config_((validate(c), c)) {
  model = register_module("model", LlamaModel(c, o));
  if (c.tie_word_embeddings) {
    // One tensor under two names, as transformers ties them: sharded, gathered and reduced once.
    tied_head = register_module("lm_head", std::make_shared<torch::nn::Module>());
    tied_head->register_parameter("weight", model->embed_tokens->weight);
  } else {
    lm_head = register_module(
        "lm_head", Linear(c.hidden_size, c.vocab_size, /*bias=*/false, c.initializer_range, o));
  }
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  auto h = model->forward(tokens);
  return tied_head ? torch::nn::functional::linear(h, model->embed_tokens->weight) : lm_head(h);
}

LlamaForCausalLM build_llama(const Config& config, const BuildOptions& options) {
  return LlamaForCausalLM(config, options);
}

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
