// The Llama modules (llama.h). Each forward follows transformers 5.24's modeling_llama.py op for
// op, in the same order and with the same kernels, so that logits agree to rounding (measured
// by tests/reference/llama_logits_check.py).
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/container/modulelist.h>

#include <algorithm>
#include <cmath>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_lora.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/fused.h"
#include "fsdp/ops/linear_cross_entropy.h"
#include "model_check.h"
#include "rotary.h"

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

bool tensor_parallel(const BuildOptions& o) { return o.tp != nullptr && o.tp->size() > 1; }
bool splits_sequence(const BuildOptions& o) { return tensor_parallel(o) && o.sequence_parallel; }

// Before a column-parallel matmul: the input whole on every rank (gathered from the sequence's
// chunks under sequence parallelism), its gradient summed over the group.
torch::Tensor to_column_input(const torch::Tensor& x, const ProcessGroupPtr& tp, bool sp) {
  return sp ? tp::gather_sequence(x, tp) : tp::copy_to_tp(x, tp);
}

// This rank's chunk along `dim` of a tensor of `shape` (the whole shape without tensor
// parallelism).
tp::Chunk chunk_along(const BuildOptions& o, int64_t full) {
  if (!tensor_parallel(o)) return {0, full};
  return tp::chunk_of(full, o.tp->size(), o.tp->rank());
}

// A weight of the full `shape`, this rank's chunk along `dim`: drawn whole (the same values at
// every TP degree), then sliced; uninitialised at the chunk's shape before a load.
torch::Tensor init_slice(std::vector<int64_t> shape, int64_t dim, double std,
                         const BuildOptions& o) {
  const auto c = chunk_along(o, shape[dim]);
  if (!o.random_init || !tensor_parallel(o)) {
    shape[dim] = o.random_init ? shape[dim] : c.length;
    return init_weight(shape, std, o);
  }
  return init_weight(shape, std, o).narrow(dim, c.offset, c.length).contiguous();
}

// LoRA: every parameter of `module` but the adapters' frozen (PEFT's mark_only_lora_as_trainable).
void freeze_all_but_lora(torch::nn::Module& module) {
  for (auto& p : module.named_parameters(/*recurse=*/true)) {
    p.value().requires_grad_(is_lora_parameter(p.key()));
  }
}

// The targeted Linear gets its adapter.
void adapt(Linear& linear, const std::string& name, const BuildOptions& o) {
  const auto& t = o.lora.targets;
  if (o.lora.enabled() && std::find(t.begin(), t.end(), name) != t.end()) {
    linear->add_lora(o.lora, o);
  }
}

// The Linear computes in float8 unless the options skip it (Float8Options).
void convert_float8(Linear& linear, const std::string& name, const BuildOptions& o) {
  const auto& skip = o.float8.skip;
  if (o.float8.enabled && std::find(skip.begin(), skip.end(), name) == skip.end()) {
    linear->use_float8(o.float8.scaling);
  }
}

// sdpa_attention_forward's repeat_kv: [b, kv, s, d] -> [b, kv * n, s, d], each head n times.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n) {
  if (n == 1) return x;
  const auto b = x.size(0), kv = x.size(1), s = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({b, kv, n, s, d}).reshape({b, kv * n, s, d});
}

}  // namespace

LinearImpl::LinearImpl(int64_t in, int64_t out, bool with_bias, double std, const BuildOptions& o,
                       TpStyle style)
    : style_(tensor_parallel(o) ? style : TpStyle::kNone),
      tp_(o.tp),
      sequence_parallel_(splits_sequence(o)) {
  if (style_ == TpStyle::kNone) {
    weight = register_parameter("weight", init_weight({out, in}, std, o));
    if (with_bias) bias = register_parameter("bias", torch::zeros({out}, options_of(o)));
    return;
  }
  const bool column = style_ == TpStyle::kColumn;
  weight = register_parameter("weight", init_slice({out, in}, column ? 0 : 1, std, o));
  // A column-parallel bias is chunked with the rows; a row-parallel one is added once, after
  // the sum, so every rank holds it whole.
  const int64_t bias_rows = column ? chunk_along(o, out).length : out;
  if (with_bias) bias = register_parameter("bias", torch::zeros({bias_rows}, options_of(o)));
}

void LinearImpl::add_lora(const LoraOptions& lora, const BuildOptions& o) {
  FSDP_MODEL_CHECK(style_ == TpStyle::kNone,
                   "llama: LoRA adapters under tensor parallelism are "
                   "not supported");
  FSDP_MODEL_CHECK(!lora_A, "llama: this Linear has an adapter already");
  const int64_t out = weight.size(0), in = weight.size(1);
  FSDP_MODEL_CHECK(
      lora.rank > 0 && lora.rank <= std::min(in, out),
      "llama: LoRA rank {} for a Linear of {} inputs and {} outputs (expected 1 to {})", lora.rank,
      in, out, std::min(in, out));
  // PEFT's LoraLayer.update_layer: nn.Linear(in, r, bias=False) then reset_lora_parameters,
  // which draws A by kaiming_uniform_(a=sqrt(5)) (nn.Linear's own init) and zeroes B.
  lora_A = register_module("lora_A",
                           torch::nn::Linear(torch::nn::LinearOptions(in, lora.rank).bias(false)));
  lora_B = register_module("lora_B",
                           torch::nn::Linear(torch::nn::LinearOptions(lora.rank, out).bias(false)));
  {
    torch::NoGradGuard no_grad;
    lora_B->weight.zero_();
  }
  lora_A->to(o.dtype);
  lora_B->to(o.dtype);
  lora_scaling_ = lora.scaling();
  lora_dropout_ = lora.dropout;
}

void LinearImpl::use_float8(ops::Float8Scaling scaling) {
  FSDP_MODEL_CHECK(style_ == TpStyle::kNone && !lora_A,
                   "llama: float8 Linears under tensor parallelism or with LoRA adapters are "
                   "not supported");
  const auto why = ops::float8_linear_unsupported(weight.size(1), weight.size(0));
  FSDP_MODEL_CHECK(why.empty(), "llama: float8: {}", why);
  float8_ = true;
  float8_scaling_ = scaling;
}

torch::Tensor LinearImpl::forward(const torch::Tensor& x) {
  if (float8_) return ops::float8_linear(x, weight, bias, float8_weight_scale_, float8_scaling_);
  if (lora_A) {
    // PEFT's lora.Linear.forward: the base layer's result, then the update added in its order.
    auto y = torch::nn::functional::linear(x, weight, bias);
    // PEFT's nn.Dropout: in training mode (activation checkpointing's recompute restores the
    // random state, so it draws the first run's masks); evaluation and generation set eval().
    const bool drop = lora_dropout_ > 0 && is_training();
    const auto h = drop ? torch::dropout(x, lora_dropout_, /*train=*/true) : x;
    return y + lora_B(lora_A(h)) * lora_scaling_;
  }
  if (style_ != TpStyle::kRow) return torch::nn::functional::linear(x, weight, bias);
  if (sequence_parallel_) {
    // The partial sums reduce-scattered over the sequence; the bias then meets each rank's
    // chunk of tokens only, so its gradient is summed over the group.
    auto y = tp::reduce_scatter_sequence(torch::nn::functional::linear(x, weight), tp_);
    return bias.defined() ? y + tp::copy_to_tp(bias, tp_) : y;
  }
  auto y = tp::reduce_from_tp(torch::nn::functional::linear(x, weight), tp_);
  return bias.defined() ? y + bias : y;
}

EmbeddingImpl::EmbeddingImpl(int64_t vocab, int64_t dim, std::optional<int64_t> padding_idx,
                             double std, const BuildOptions& o)
    : padding_idx_(-1),
      rows_(chunk_along(o, vocab)),
      tp_(tensor_parallel(o) ? o.tp : nullptr),
      sequence_parallel_(splits_sequence(o)) {
  auto w =
      o.random_init ? init_weight({vocab, dim}, std, o) : init_weight({rows_.length, dim}, std, o);
  // nn.Embedding and HF's _init_weights zero the padding row.
  if (padding_idx && o.random_init) w[*padding_idx].zero_();
  if (o.random_init && tp_) w = w.narrow(0, rows_.offset, rows_.length).contiguous();
  if (padding_idx && *padding_idx >= rows_.offset && *padding_idx < rows_.offset + rows_.length) {
    padding_idx_ = *padding_idx - rows_.offset;
  }
  weight = register_parameter("weight", w);
}

torch::Tensor EmbeddingImpl::forward(const torch::Tensor& tokens) {
  if (!tp_) {
    return torch::embedding(weight, tokens, padding_idx_, /*scale_grad_by_freq=*/false,
                            /*sparse=*/false);
  }
  // Megatron's VocabParallelEmbedding: the rows of other ranks look up row 0 and are zeroed,
  // so that the sum over the group is the lookup of the whole table (x + 0 is exact).
  auto here = tokens.ge(rows_.offset) & tokens.lt(rows_.offset + rows_.length);
  auto local = (tokens - rows_.offset).masked_fill(here.logical_not(), 0);
  // A rank without rows (a vocabulary smaller than the degree) still links its (empty) weight
  // into the graph, so that every rank's parameters get gradients alike.
  auto rows =
      rows_.length > 0
          ? torch::embedding(weight, local, padding_idx_, false, false)
          : torch::zeros({tokens.size(0), tokens.size(1), 0}, weight.options()).matmul(weight);
  auto mine = rows * here.unsqueeze(-1).to(rows.scalar_type());
  // Sequence parallelism: each rank keeps the sum for its chunk of the sequence only.
  return sequence_parallel_ ? tp::reduce_scatter_sequence(mine, tp_)
                            : tp::reduce_from_tp(mine, tp_);
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps, const BuildOptions& o)
    : eps_(eps), sp_(splits_sequence(o) ? o.tp : nullptr) {
  weight = register_parameter("weight", torch::ones({dim}, options_of(o)));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // LlamaRMSNorm.forward, not torch::rms_norm: the variance in fp32 and the weight applied
  // after the cast back, which rounds differently in bf16.
  // Under sequence parallelism each rank normalises its chunk of the sequence: the weight's
  // gradient from every chunk is summed over the group (copy_to_tp's backward). One kernel on
  // a GPU with the CUDA kernels, else this formula op for op (fsdp/ops/fused.h).
  return ops::rms_norm(x, sp_ ? tp::copy_to_tp(weight, sp_) : weight, eps_);
}

std::pair<torch::Tensor, torch::Tensor> RMSNormImpl::add_and_forward(const torch::Tensor& x,
                                                                     const torch::Tensor& y) {
  return ops::add_rms_norm(x, y, sp_ ? tp::copy_to_tp(weight, sp_) : weight, eps_);
}

AttentionImpl::AttentionImpl(const Config& c, const BuildOptions& o)
    : heads_(c.num_attention_heads),
      kv_heads_(c.num_key_value_heads),
      head_size_(c.head_size()),
      tp_(tensor_parallel(o) ? o.tp : nullptr),
      sequence_parallel_(splits_sequence(o)) {
  const double std = c.initializer_range;
  const auto col = TpStyle::kColumn;
  const int64_t d = c.hidden_size;
  q_proj = register_module("q_proj", Linear(d, c.q_size(), c.qkv_bias(), std, o, col));
  k_proj = register_module("k_proj", Linear(d, c.kv_size(), c.qkv_bias(), std, o, col));
  v_proj = register_module("v_proj", Linear(d, c.kv_size(), c.qkv_bias(), std, o, col));
  o_proj = register_module("o_proj", Linear(c.q_size(), d, c.o_bias(), std, o, TpStyle::kRow));
  adapt(q_proj, "q_proj", o);
  adapt(k_proj, "k_proj", o);
  adapt(v_proj, "v_proj", o);
  adapt(o_proj, "o_proj", o);
  convert_float8(q_proj, "q_proj", o);
  convert_float8(k_proj, "k_proj", o);
  convert_float8(v_proj, "v_proj", o);
  convert_float8(o_proj, "o_proj", o);
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x_in, const torch::Tensor& cos,
                                     const torch::Tensor& sin, const torch::Tensor& documents) {
  // Under tensor parallelism each rank has heads / tp query heads and kv_heads / tp key/value
  // heads (validate_tp): the same groups, so the same attention per head.
  const auto x = to_column_input(x_in, tp_, sequence_parallel_);
  const int64_t batch = x.size(0), seq = x.size(1);
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({batch, seq, -1, head_size_}).transpose(1, 2);
  };
  auto q = heads_first(q_proj(x));
  auto k = heads_first(k_proj(x));
  auto v = heads_first(v_proj(x));
  // apply_rotary_pos_emb(unsqueeze_dim=1)
  q = ops::rope(q, cos, sin);
  k = ops::rope(k, cos, sin);
  // Generation: the cached tokens' keys and values first (DynamicCache.update), kept before the
  // key/value heads are repeated.
  int64_t past = 0;
  if (cache_) {
    if (cache_->keys.defined()) {
      past = cache_->keys.size(2);
      k = torch::cat({cache_->keys, k}, 2);
      v = torch::cat({cache_->values, v}, 2);
    }
    cache_->keys = k;
    cache_->values = v;
  }
  // sdpa_attention_forward on CPU: grouped-query attention inside the kernel when the head size
  // is at most 256 (use_gqa_in_sdpa), else the key/value heads repeated; causal from 2 tokens.
  const int64_t groups = heads_ / kv_heads_;
  const bool gqa = groups > 1 && head_size_ <= 256;
  if (groups > 1 && !gqa) {
    k = repeat_kv(k, groups);
    v = repeat_kv(v, groups);
  }
  const double scale = std::pow(static_cast<double>(head_size_), -0.5);
  // Causal: after cached tokens the kernel's is_causal (aligned top-left) is wrong, so query i
  // gets an explicit mask of the keys up to past + i; one new token sees every key.
  std::optional<torch::Tensor> mask;
  if (documents.defined()) {
    mask = documents;  // packed documents: causal within each
  } else if (past > 0 && seq > 1) {
    mask = torch::ones({seq, past + seq}, torch::TensorOptions(torch::kBool).device(q.device()))
               .tril(past);
  }
  auto out = at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0,
                                              /*is_causal=*/!mask && past == 0 && seq > 1, scale,
                                              /*enable_gqa=*/gqa);
  out = out.transpose(1, 2).contiguous().reshape({batch, seq, -1});
  return o_proj(out);
}

MLPImpl::MLPImpl(const Config& c, const BuildOptions& o)
    : tp_(tensor_parallel(o) ? o.tp : nullptr), sequence_parallel_(splits_sequence(o)) {
  const double std = c.initializer_range;
  const int64_t d = c.hidden_size, i = c.intermediate_size;
  const auto col = TpStyle::kColumn;
  gate_proj = register_module("gate_proj", Linear(d, i, c.mlp_bias, std, o, col));
  up_proj = register_module("up_proj", Linear(d, i, c.mlp_bias, std, o, col));
  down_proj = register_module("down_proj", Linear(i, d, c.mlp_bias, std, o, TpStyle::kRow));
  adapt(gate_proj, "gate_proj", o);
  adapt(up_proj, "up_proj", o);
  adapt(down_proj, "down_proj", o);
  convert_float8(gate_proj, "gate_proj", o);
  convert_float8(up_proj, "up_proj", o);
  convert_float8(down_proj, "down_proj", o);
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x_in) {
  const auto x = to_column_input(x_in, tp_, sequence_parallel_);
  // silu(gate) * up: one kernel on a GPU with the CUDA kernels (fsdp/ops/fused.h).
  return down_proj(ops::swiglu(gate_proj(x), up_proj(x)));
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
                                        const torch::Tensor& sin, const torch::Tensor& documents) {
  // h = x + attention, and its norm, in one kernel on a GPU.
  auto [h, normed] = post_attention_layernorm->add_and_forward(
      x, self_attn(input_layernorm(x), cos, sin, documents));
  return h + mlp(normed);
}

LlamaModelImpl::LlamaModelImpl(const Config& c, const BuildOptions& o)
    : config_(c), inv_freq_(rotary_inverse_frequencies(c)) {
  embed_tokens = register_module("embed_tokens", Embedding(c.vocab_size, c.hidden_size,
                                                           c.pad_token_id, c.initializer_range, o));
  auto list = register_module("layers", torch::nn::ModuleList());
  layers.reserve(c.num_hidden_layers);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    DecoderLayer layer(c, o);
    // Frozen before on_layer_built shards it: FSDP then reduces the adapters' gradients only.
    if (o.lora.enabled()) freeze_all_but_lora(*layer);
    list->push_back(layer);
    layers.push_back(layer);
    if (o.on_layer_built) o.on_layer_built(i, layers.back());
  }
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps, o));
  if (o.lora.enabled()) {
    freeze_all_but_lora(*embed_tokens);
    freeze_all_but_lora(*norm);
  }
}

torch::Tensor LlamaModelImpl::forward(const torch::Tensor& tokens) {
  FSDP_MODEL_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                   "llama: tokens must be [batch, seq] int64, got {} {}",
                   c10::toString(tokens.scalar_type()), tokens.sizes().vec());
  auto h = embed_tokens(tokens);
  // Moved once, at the first forward on a device, not copied in every step.
  if (inv_freq_.device() != h.device()) inv_freq_ = inv_freq_.to(h.device());
  const int64_t past = cache_ ? *cached_ : 0, seq = tokens.size(1);
  auto [cos, sin] = cos_sin_of(inv_freq_, past + seq, h.scalar_type());
  // Packed documents (set_document_start; training and evaluation, not generation): every
  // occurrence of the start id begins a document whose positions count from 0 and whose
  // tokens attend only to the document's earlier tokens. The window's first token starts one
  // too (a document cut by the window counts from there, as a packing collator's would).
  torch::Tensor documents;
  if (document_start_ && !cache_) {
    auto index = torch::arange(seq, tokens.options()).expand({tokens.size(0), seq});
    auto starts = tokens.eq(*document_start_);
    auto first = std::get<0>(torch::where(starts, index, torch::zeros_like(index)).cummax(1));
    auto positions = index - first;
    auto document = starts.to(torch::kLong).cumsum(1);
    documents = document.unsqueeze(2)
                    .eq(document.unsqueeze(1))
                    .logical_and(torch::ones({seq, seq}, starts.options()).tril())
                    .unsqueeze(1);            // [batch, 1, seq, seq]: true where a query sees a key
    cos = cos.squeeze(0).index({positions});  // [batch, seq, head_size]
    sin = sin.squeeze(0).index({positions});
  }
  if (past > 0) {
    cos = cos.narrow(1, past, seq);
    sin = sin.narrow(1, past, seq);
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    layers[i]->self_attn->set_cache(cache_ ? &(*cache_)[i] : nullptr);
    h = documents.defined() ? layers[i](h, cos, sin, documents) : layers[i](h, cos, sin);
  }
  if (cache_) *cached_ += seq;
  return norm(h);
}

void LlamaModelImpl::set_cache(std::vector<LayerCache>* cache, int64_t* cached) {
  FSDP_MODEL_CHECK(!cache || (cached && cache->size() == layers.size()),
                   "llama: a cache needs one LayerCache per layer ({}) and a token count",
                   layers.size());
  cache_ = cache;
  cached_ = cached;
  if (!cache) {
    for (auto& layer : layers) layer->self_attn->set_cache(nullptr);
  }
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, const BuildOptions& o)
    : config_((validate(c), validate_tp(c, o.tp ? o.tp->size() : 1),
               validate_lora(c, o.lora, o.tp ? o.tp->size() : 1),
               validate_float8(c, o.float8, o.tp ? o.tp->size() : 1, o.lora.enabled()), c)),
      tp_(tensor_parallel(o) ? o.tp : nullptr),
      sequence_parallel_(splits_sequence(o)) {
  model = register_module("model", LlamaModel(c, o));
  if (c.tie_word_embeddings) {
    // One tensor under two names, as transformers ties them: sharded, gathered and reduced once.
    tied_head = register_module("lm_head", std::make_shared<torch::nn::Module>());
    tied_head->register_parameter("weight", model->embed_tokens->weight);
  } else {
    lm_head = register_module("lm_head", Linear(c.hidden_size, c.vocab_size, /*bias=*/false,
                                                c.initializer_range, o, TpStyle::kColumn));
  }
  // The head, and the tied one: register_parameter made the embedding's tensor trainable again.
  if (o.lora.enabled()) freeze_all_but_lora(*this);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens) {
  // Under tensor parallelism the head is column-parallel over the vocabulary (tied or not: the
  // embedding's rows are the same chunk), and its logits stay split (loss parallel).
  if (sequence_parallel_) {
    FSDP_MODEL_CHECK(tokens.dim() == 2 && tokens.size(1) % tp_->size() == 0,
                     "llama: sequence parallelism needs the sequence ({} tokens) to divide by the "
                     "tensor-parallel degree {}",
                     tokens.dim() == 2 ? tokens.size(1) : 0, tp_->size());
  }
  auto h = to_column_input(model->forward(tokens), tp_, sequence_parallel_);
  return tied_head ? torch::nn::functional::linear(h, model->embed_tokens->weight) : lm_head(h);
}

torch::Tensor LlamaForCausalLMImpl::loss(const torch::Tensor& logits,
                                         const torch::Tensor& targets) const {
  const int64_t columns = logits.size(-1);
  if (!tp_) {
    return torch::nn::functional::cross_entropy(
        logits.reshape({targets.numel(), columns}).to(torch::kFloat), targets.reshape(-1));
  }
  const auto c = tp::chunk_of(config_.vocab_size, tp_->size(), tp_->rank());
  // [tokens, columns] by the targets' count: a rank without columns has no -1 to infer.
  return tp::vocab_parallel_cross_entropy(logits.reshape({targets.numel(), columns}),
                                          targets.reshape(-1), c.offset, config_.vocab_size, tp_);
}

torch::Tensor LlamaForCausalLMImpl::fused_loss(const torch::Tensor& tokens,
                                               const torch::Tensor& targets, int64_t chunk_tokens) {
  FSDP_MODEL_CHECK(tied_head || (!lm_head->lora_A && !lm_head->bias.defined()),
                   "llama: the fused loss needs a plain head (lm_head has a LoRA adapter or a "
                   "bias)");
  FSDP_MODEL_CHECK(targets.sizes() == tokens.sizes(),
                   "llama: targets {} for tokens {}: expected the same shape", targets.sizes(),
                   tokens.sizes());
  if (sequence_parallel_) {
    FSDP_MODEL_CHECK(tokens.dim() == 2 && tokens.size(1) % tp_->size() == 0,
                     "llama: sequence parallelism needs the sequence ({} tokens) to divide by the "
                     "tensor-parallel degree {}",
                     tokens.dim() == 2 ? tokens.size(1) : 0, tp_->size());
  }
  auto h = to_column_input(model->forward(tokens), tp_, sequence_parallel_);
  const auto& weight = tied_head ? model->embed_tokens->weight : lm_head->weight;
  ops::LinearCrossEntropyOptions options;
  options.chunk_tokens = chunk_tokens;
  if (tp_) {
    const auto c = tp::chunk_of(config_.vocab_size, tp_->size(), tp_->rank());
    options.tp = tp_;
    options.vocab_offset = c.offset;
    options.vocab = config_.vocab_size;
  }
  return ops::linear_cross_entropy(h.reshape({-1, h.size(-1)}), weight, targets.reshape(-1),
                                   options);
}

torch::Tensor LlamaForCausalLMImpl::full_logits(const torch::Tensor& logits) const {
  return tp_ ? tp::gather_last_dim(logits, config_.vocab_size, tp_) : logits;
}

LlamaForCausalLM build_llama(const Config& config, const BuildOptions& options) {
  return LlamaForCausalLM(config, options);
}

}  // namespace fsdp::models::llama
