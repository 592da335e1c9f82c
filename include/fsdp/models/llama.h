// Llama: Hugging Face's LlamaForCausalLM in libtorch, op for op (transformers 5.24,
// models/llama/modeling_llama.py), with its parameter names, so that weights move between the
// two programs (and MLX, llama.cpp's converter) as they are. Mistral and Qwen2 too, where
// their math is Llama's (llama_config.h says which configs).
//
//   token embedding -> decoder layers -> final RMSNorm -> lm_head (tied or not)
//   decoder layer: x + attention(RMSNorm(x)), then h + mlp(RMSNorm(h))
//   attention: q, k, v projections, rotary embeddings (rope_theta, transformers' rotate-half
//     layout, inverse frequencies and cos/sin computed in fp32, cast to the compute dtype),
//     at::scaled_dot_product_attention(causal, scale head_size^-0.5, enable_gqa when there
//     are fewer key/value heads), o projection
//   mlp: down(silu(gate(x)) * up(x))
//   RMSNorm: in fp32, x * rsqrt(mean(x^2) + eps), back to the input dtype, times the weight
//
// Parameter names are transformers': model.embed_tokens.weight,
// model.layers.{i}.self_attn.{q,k,v,o}_proj.{weight,bias}, model.layers.{i}.mlp.{gate,up,down}
// _proj.{weight,bias}, model.layers.{i}.{input,post_attention}_layernorm.weight,
// model.norm.weight, lm_head.weight; in transformers' order. A tied head is one tensor under two
// names (model.embed_tokens.weight first), as MiniLLM's. The model registers no buffers (the
// rotary frequencies are computed once when it is built and kept beside the modules, moved to
// the activations' device at the first forward), so its state dict is exactly the parameters a
// Hugging Face directory holds.
//
// FSDP: each decoder layer is an fsdp::Unit<DecoderLayer>; shard every layer, then the root
// (whose own parameters are the embedding, the final norm and the head). The LayerBuilt
// callback runs right after each layer is built, so a caller that shards there never holds
// more than one full layer plus the root's parameters (start-up without the full model).
//
// Why an installed library target (fsdp::models) rather than an example: the model is an API
// that more than one program uses (the Llama trainer, the tests against transformers, the
// planner's units, a user's own training or inference program), and its contract is the
// Hugging Face format, which must not drift between copies. An example is one program a user
// reads and copies; a model with checkpoint I/O that must stay bit-compatible with
// transformers belongs where it is built once, tested once and linked (find_package(fsdp),
// fsdp::models), like MiniLLM.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/models/float8_options.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/lora_options.h"
#include "fsdp/models/torch_modules.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::models::llama {

struct BuildOptions;  // below: dtype, random init, the LayerBuilt callback

// How a Linear splits over the tensor-parallel group (BuildOptions::tp; fsdp/parallel/
// tensor_parallel.h): not at all, by output rows (column-parallel: q, k, v, gate, up, the head)
// or by input columns (row-parallel: o, down; the output summed over the group, then the bias).
enum class TpStyle { kNone, kColumn, kRow };

// nn.Linear's parameters (weight [out, in], optional bias [out]) without its initialisation:
// the model initialises every tensor itself (HF's _init_weights), or not at all before a load.
// Under tensor parallelism the weight is this rank's chunk (tp::chunk_of) of the full one,
// drawn whole and sliced, so that the values do not depend on the TP degree.
class LinearImpl : public torch::nn::Module {
 public:
  // Weight normal(0, std) (see BuildOptions::random_init), bias zero.
  LinearImpl(int64_t in, int64_t out, bool bias, double std, const BuildOptions& options,
             TpStyle style = TpStyle::kNone);
  // Column-parallel: x whole, the output this rank's chunk of the features (the caller applies
  // tp::copy_to_tp to x once for the Linears that share it). Row-parallel: x this rank's chunk
  // of the features, the output whole.
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // bias undefined without one

  // A LoRA adapter (lora_options.h): registers lora_A [rank, in] (nn.Linear's init from
  // torch's generator) and lora_B [out, rank] (zero), cast to the options' dtype; the forward
  // then adds (lora_B(lora_A(dropout(x)))) * alpha / rank, dropout only in a forward that
  // records gradients in training mode. Not under tensor parallelism.
  void add_lora(const LoraOptions& lora, const BuildOptions& options);
  torch::nn::Linear lora_A{nullptr}, lora_B{nullptr};  // null without an adapter
  double lora_scaling() const { return lora_scaling_; }
  // The GEMMs in float8 from now on (ops::float8_linear, with `scaling`; validate_float8 says
  // which Linears can). Not with an adapter or tensor parallelism.
  void use_float8(ops::Float8Scaling scaling = ops::Float8Scaling::tensorwise);
  bool float8() const { return float8_; }
  ops::Float8Scaling float8_scaling() const { return float8_scaling_; }
  // The scale a float8 all-gather cast the weight with (ops::float8_linear's weight_scale; set
  // by use_float8_all_gather's hook at each gather).
  void set_float8_weight_scale(const torch::Tensor& scale) { float8_weight_scale_ = scale; }

 private:
  double lora_scaling_ = 0, lora_dropout_ = 0;
  bool float8_ = false;
  ops::Float8Scaling float8_scaling_ = ops::Float8Scaling::tensorwise;
  torch::Tensor float8_weight_scale_;  // undefined: the weight's own
  TpStyle style_;
  ProcessGroupPtr tp_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(Linear);

// nn.Embedding(vocab, hidden, padding_idx): weight [vocab, hidden]; the padding row (when the
// config names a pad_token_id) gets no gradient, as in transformers. Under tensor parallelism
// vocabulary-parallel: this rank's chunk of the rows; a token outside it looks up zeros and the
// lookups are summed over the group.
class EmbeddingImpl : public torch::nn::Module {
 public:
  EmbeddingImpl(int64_t vocab, int64_t dim, std::optional<int64_t> padding_idx, double std,
                const BuildOptions& options);
  torch::Tensor forward(const torch::Tensor& tokens);
  torch::Tensor weight;

 private:
  int64_t padding_idx_;  // -1: none (or not in this rank's rows)
  tp::Chunk rows_;       // this rank's rows of the vocabulary
  ProcessGroupPtr tp_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(Embedding);

// LlamaRMSNorm: fp32 compute, weight * normalised.to(input dtype).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps, const BuildOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  // {x + y, forward(x + y)}: a residual add and this norm after it, one kernel on a GPU
  // (fsdp/ops/fused.h's add_rms_norm).
  std::pair<torch::Tensor, torch::Tensor> add_and_forward(const torch::Tensor& x,
                                                          const torch::Tensor& y);
  torch::Tensor weight;

 private:
  double eps_;
  ProcessGroupPtr sp_;  // sequence parallelism: the weight's gradient is summed over the group
};
TORCH_MODULE(RMSNorm);

// cos and sin of the rotary embedding for positions 0..seq-1: [1, seq, head_size], computed in
// fp32 as LlamaRotaryEmbedding does, then cast to `dtype`.
std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const Config& config, int64_t seq,
                                                       torch::ScalarType dtype,
                                                       torch::Device device);

// One layer's keys and values of the tokens seen so far ([batch, kv heads, tokens, head_size],
// after the rotary embedding): transformers' DynamicCache layer. Undefined before the first.
struct LayerCache {
  torch::Tensor keys, values;
};

class AttentionImpl : public torch::nn::Module {
 public:
  AttentionImpl(const Config& config, const BuildOptions& options);
  // x [batch, seq, hidden]; cos, sin [1, seq, head_size] -> [batch, seq, hidden]. With a cache
  // set (set_cache), x is the tokens after the cached ones (cos and sin at their positions):
  // their keys and values join the cache and each token attends to every cached one and to
  // those before it.
  // `documents` (packing, LlamaModelImpl::set_document_start): [batch, 1, seq, seq], true where
  // a query may attend to a key; undefined: causal. cos and sin are then [batch, seq, ...].
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& documents = {});
  // The cache the next forwards read and extend; null: none (training).
  void set_cache(LayerCache* cache) { cache_ = cache; }
  Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  LayerCache* cache_ = nullptr;
  int64_t heads_, kv_heads_, head_size_;
  ProcessGroupPtr tp_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(Attention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const Config& config, const BuildOptions& options);
  torch::Tensor forward(const torch::Tensor& x);
  Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  ProcessGroupPtr tp_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(MLP);

class DecoderLayerImpl : public torch::nn::Module {
 public:
  DecoderLayerImpl(const Config& config, const BuildOptions& options);
  // x [batch, seq, hidden]; cos, sin from rotary_cos_sin in x's dtype; documents: as
  // AttentionImpl's.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        const torch::Tensor& documents = {});
  Attention self_attn{nullptr};
  MLP mlp{nullptr};
  RMSNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
};
TORCH_MODULE(DecoderLayer);

// Runs right after layer `index` is built and initialised, before the next: fully_shard it
// here. Random numbers are drawn in construction order either way, so a model sharded as it is
// built starts from the same values as the unsharded model of the same seed.
using LayerBuilt = std::function<void(int64_t index, fsdp::Unit<DecoderLayer>& layer)>;

struct BuildOptions {
  torch::ScalarType dtype = torch::kFloat;  // the parameters' dtype
  // HF's init from torch's generator: every weight normal(0, initializer_range) drawn in fp32
  // (then cast), norm weights one, biases zero, the padding row of the embedding zero. Off:
  // parameters are left uninitialised (torch::empty), for a load that overwrites them all.
  bool random_init = true;
  LayerBuilt on_layer_built;
  // Tensor parallelism (Megatron's, as transformers' base_model_tp_plan and TorchTitan's Llama
  // plan): q, k, v, gate and up column-parallel, o and down row-parallel, the embedding and the
  // head vocabulary-parallel; norms whole on every rank. The heads and the key/value heads must
  // divide by the group's size (InvalidArgument naming them otherwise). Null or one rank: none.
  // The forward then returns this rank's chunk of the vocabulary's logits (tp_logits_loss).
  ProcessGroupPtr tp;
  // With tp: sequence parallelism (TorchTitan's): the activations between the split matmuls
  // (the norms, the residual stream) are split over the sequence, all-gathered before each
  // column-parallel matmul and reduce-scattered after each row-parallel one, instead of whole
  // on every rank and all-reduced. The same math; the sequence must divide by the degree.
  bool sequence_parallel = false;
  // LoRA (lora_options.h): adapters on the targeted Linears of every decoder layer, and every
  // other parameter frozen (requires_grad false) before on_layer_built runs, so that FSDP
  // reduces the adapters' gradients only. Adapters are drawn whatever random_init says (a load
  // of base weights leaves them as PEFT makes them). Checked by validate_lora (llama_lora.h):
  // InvalidArgument for a target that names no Linear, a rank above a target's dimensions, or
  // tensor parallelism.
  LoraOptions lora;
  // float8 (fsdp/models/float8_options.h), checked by validate_float8.
  Float8Options float8;
};

// InvalidArgument unless `float8` can run on this model: every Linear it converts has inputs
// and outputs that are multiples of 16, each skip names a decoder Linear, and neither tensor
// parallelism (a weight's scale would be its shard's, not the whole weight's as torchao's
// float8 tensor parallelism makes it) nor LoRA (adapters on float8 base weights; no reference
// to prove them against) is asked for with it.
void validate_float8(const Config& config, const Float8Options& float8, int tp_size = 1,
                     bool lora = false);

// Gathers the float8 Linears' weights of a sharded decoder layer (or any unit holding
// LinearImpls) in float8 (fsdp/ops/float8_all_gather.h): half of bf16's bytes for them, the
// same numbers. Sets the unit's custom all-gather (every rank must). InvalidArgument when the
// unit holds no float8 Linear.
void use_float8_all_gather(FSDPModule& unit);

// LlamaModel: the child "model" of the root.
class LlamaModelImpl : public torch::nn::Module {
 public:
  LlamaModelImpl(const Config& config, const BuildOptions& options);
  // tokens [batch, seq] int64 -> the final norm's output [batch, seq, hidden].
  torch::Tensor forward(const torch::Tensor& tokens);
  // Generation (llama_generate.h): the forwards that follow read and extend `cache` (one
  // LayerCache per layer; `tokens` are the ones after its `*cached` tokens, whose count the
  // forward advances); null turns it off.
  void set_cache(std::vector<LayerCache>* cache, int64_t* cached);
  // Packing: the forwards without a cache treat every occurrence of `id` (a chat template's
  // begin-of-text token) as the start of a document: positions restart at 0 there and
  // attention stays inside each document, as transformers computes with position_ids that
  // restart and a block-diagonal causal mask. nullopt: off (the default).
  void set_document_start(std::optional<int64_t> id) { document_start_ = id; }

  Embedding embed_tokens{nullptr};
  // The layers, registered as the children "0", "1", ... of a ModuleList named "layers".
  std::vector<fsdp::Unit<DecoderLayer>> layers;
  RMSNorm norm{nullptr};

 private:
  Config config_;
  torch::Tensor inv_freq_;  // the rotary inverse frequencies, fp32 [head_size / 2]
  std::vector<LayerCache>* cache_ = nullptr;
  int64_t* cached_ = nullptr;
  std::optional<int64_t> document_start_;
};
TORCH_MODULE(LlamaModel);

// LlamaForCausalLM: the root. Forward: tokens [batch, seq] int64 -> logits [batch, seq,
// vocab] in the compute dtype (callers cast to fp32 for the loss, as transformers does); under
// tensor parallelism [batch, seq, this rank's chunk of the vocabulary] (loss() and
// full_logits() combine them).
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const Config& config, const BuildOptions& options = {});
  torch::Tensor forward(const torch::Tensor& tokens);

  // The mean cross-entropy of `targets` [batch, seq] (ignore_index -100 not counted) under
  // `logits` from forward (whole, or this rank's chunk under tensor parallelism: TorchTitan's
  // loss parallel), in fp32: the same value on every rank of the TP group.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) const;
  // loss(forward(tokens), targets) with the head and the loss fused (ops::linear_cross_entropy:
  // the [batch, seq, vocab] logits never exist, `chunk_tokens` tokens at a time, 0: automatic);
  // under tensor parallelism its vocabulary-parallel form. Call it through the root unit
  // (`root.call(&LlamaForCausalLMImpl::fused_loss, tokens, targets, 0)`), which gathers the
  // parameters as forward does. InvalidArgument for a head with a LoRA adapter or a bias.
  torch::Tensor fused_loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                           int64_t chunk_tokens = 0);
  // The whole vocabulary's logits from forward's (gathered under tensor parallelism; no
  // gradient then).
  torch::Tensor full_logits(const torch::Tensor& logits) const;
  // The tensor-parallel group (null without), and whether the sequence is split too.
  const ProcessGroupPtr& tp() const { return tp_; }
  bool sequence_parallel() const { return sequence_parallel_; }

  const Config& config() const { return config_; }
  LlamaModel model{nullptr};
  // Untied: a Linear [vocab, hidden]. Tied: null, and "lm_head" is a parameterless module
  // holding the embedding's tensor as its "weight".
  Linear lm_head{nullptr};
  std::shared_ptr<torch::nn::Module> tied_head;

 private:
  Config config_;
  ProcessGroupPtr tp_;
  bool sequence_parallel_ = false;
};
TORCH_MODULE(LlamaForCausalLM);

// Builds the model (validate(config) first: InvalidArgument for a config it cannot build).
LlamaForCausalLM build_llama(const Config& config, const BuildOptions& options = {});
inline LlamaForCausalLM build_llama(const Config& config, const LayerBuilt& on_layer_built) {
  BuildOptions options;
  options.on_layer_built = on_layer_built;
  return build_llama(config, options);
}

// The tensors of a Hugging Face directory of this config, in transformers' order, with their
// shapes: what save_hf_checkpoint writes and load_hf_weights expects (no lm_head.weight when
// tied). Without building the model.
std::vector<std::pair<std::string, std::vector<int64_t>>> parameter_shapes(const Config& config);
std::vector<std::string> parameter_names(const Config& config);
// Under tensor parallelism of `tp_size` ranks: which slice of each full tensor (by the names of
// parameter_shapes) rank `tp_rank` holds; tensors whole on every rank (norms, row-parallel
// biases) are absent. Throws InvalidArgument when the heads or key/value heads do not divide.
std::map<std::string, tp::TpSlice> tp_slices(const Config& config, int tp_size, int tp_rank);
// The model's layout over the TP group `tp` (tp_slices of its size and rank; empty for null),
// `dp` the ranks of the same TP index (DeviceMesh::dp): what checkpoints (SaveOptions::tp,
// LoadOptions::tp) and full state dicts need.
tp::Layout tp_layout(const Config& config, const ProcessGroupPtr& tp,
                     const ProcessGroupPtr& dp = nullptr);
// The heads and key/value heads divide by `tp_size` (InvalidArgument naming them otherwise).
void validate_tp(const Config& config, int tp_size);
// Parameters of the model, each tensor once (a tied head adds none).
int64_t parameter_count(const Config& config);
// Training FLOPs per token: 6 x the matmul parameters (the head included, tied or not) plus
// attention's scores and weighted sum, 12 x layers x q_size x seq (PaLM, appendix B).
double train_flops_per_token(const Config& config, int64_t seq);

}  // namespace fsdp::models::llama
