// MiniLLM: the model of the PyTorch FSDP2 example (bench/reference/py_minillm.py), in libtorch.
// Token embedding; blocks of RMSNorm, multi-head attention, residual, RMSNorm, SiLU MLP
// (dim -> 4 dim -> dim, no bias), residual; output head dim -> vocab without bias.
//
// Kernel for kernel and name for name the PyTorch model: torch::rms_norm with its default eps
// (nn.RMSNorm), attention computed as PyTorch 2.11's nn.MultiheadAttention does in training
// with need_weights=False (packed in-projection, scaled_dot_product_attention, out-projection),
// and named_parameters() equal to PyTorch's (layers.0.attn.in_proj_weight, layers.0.ffn.0.weight,
// ...), so weights move between the two programs as they are. One exception, on a GPU where
// fsdp's CUDA kernels run (fsdp/ops/fused.h; FSDP_CUDA_KERNELS=0 turns them off): the norms
// are fsdp's kernels, the second one fused with the residual add before it (the same formula
// and eps; the numbers differ from PyTorch's kernel by rounding), and the attention runs
// batch first (SelfAttention::forward_batch_first: equal to rounding, without the forward's
// three sequence-first copies).
//
// The blocks are held as fsdp::Unit<TransformerBlock>: a plain pass-through until fully_shard
// is applied, so the same class is the single-process reference and the sharded model.
#pragma once

#include <functional>
#include <vector>

#include "fsdp/models/torch_modules.h"
#include "fsdp/ops/float8_scaling.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::models::minillm {

struct Config {
  int64_t vocab = 32000;
  int64_t dim = 256;
  int64_t layers = 4;
  int64_t heads = 8;
  // Rows of the output head; 0 means vocab (a language model). Tests use a small classifier
  // head of a size that divides by nothing.
  int64_t outputs = 0;
  int64_t output_size() const { return outputs > 0 ? outputs : vocab; }
  // The output head reuses the embedding's weight (tied; needs outputs == 0): one tensor
  // registered as both embed.weight and head.weight.
  bool tie_embeddings = false;
  // float8 training of each block's feed-forward Linears (fc1, fc2: fsdp/ops/float8.h, torchao's
  // recipe tensorwise, or float8_scaling's): what torchao's convert_to_float8_training changes in
  // the PyTorch example's model, whose nn.MultiheadAttention uses its projections' weights itself.
  // dim must be a multiple of 16 (InvalidArgument otherwise). float8_scaling: torchao's recipe,
  // tensorwise or rowwise (fsdp/ops/float8_scaling.h).
  bool float8 = false;
  ops::Float8Scaling float8_scaling = ops::Float8Scaling::tensorwise;
  // With float8: the attention's packed input projection and its output projection in float8
  // too (the same recipe), which torchao cannot convert in this model (nn.MultiheadAttention
  // uses their weights itself): the block's every GEMM but attention's own. Beyond the
  // reference's numbers (its float8 parity is with this off); InvalidArgument without float8.
  bool float8_attention = false;
};

// nn.RMSNorm(dim): x * rsqrt(mean(x^2) + eps) * weight through torch::rms_norm, whose eps
// defaults to the machine epsilon of the type it computes in (float for bf16 and half), as
// PyTorch's module does; through ops::rms_norm's kernel with that eps where it runs.
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

// nn.MultiheadAttention(dim, heads, batch_first=True) used as self-attention without mask,
// dropout or weights: its parameters (in_proj_weight [3 dim, dim], in_proj_bias [3 dim],
// out_proj.weight, out_proj.bias, initialised as PyTorch does) and its training forward.
// libtorch's own MultiheadAttention computes softmax(QK^T)V with separate kernels instead.
class SelfAttentionImpl : public torch::nn::Module {
 public:
  // float8: both projections' GEMMs in float8 (ops::float8_linear, scaled as `scaling` says).
  SelfAttentionImpl(int64_t dim, int64_t heads, bool float8 = false,
                    ops::Float8Scaling scaling = ops::Float8Scaling::tensorwise);
  // x: [batch, seq, dim] -> [batch, seq, dim]. nn.MultiheadAttention's steps, or on a GPU
  // where fsdp's CUDA kernels run (ops::cuda_kernels_run_on), forward_batch_first.
  torch::Tensor forward(const torch::Tensor& x);
  // The same attention without nn.MultiheadAttention's sequence-first copies (its input's, the
  // packed projection's, the merged heads'): the projections' GEMMs on the batch-first rows, q,
  // k and v as views of the packed projection, the output [batch, seq, dim] contiguous (so the
  // residual add after it needs no copy). Equal to forward to rounding (the same products and
  // sums, rows in another order); public so that the CPU tests check it.
  torch::Tensor forward_batch_first(const torch::Tensor& x);

  torch::Tensor in_proj_weight, in_proj_bias;
  torch::nn::Linear out_proj{nullptr};

 private:
  // The projections' linear: at::linear, or float8_linear with float8.
  torch::Tensor project(const torch::Tensor& x, const torch::Tensor& weight,
                        const torch::Tensor& bias) const;

  int64_t heads_;
  bool float8_ = false;
  ops::Float8Scaling float8_scaling_ = ops::Float8Scaling::tensorwise;
};
TORCH_MODULE(SelfAttention);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  // float8: fc1 and fc2 compute in float8 (Config::float8), scaled as `scaling` says;
  // float8_attention: the attention's projections too (Config::float8_attention).
  TransformerBlockImpl(int64_t dim, int64_t heads, bool float8 = false,
                       ops::Float8Scaling scaling = ops::Float8Scaling::tensorwise,
                       bool float8_attention = false);
  // x: [batch, seq, dim] (batch first, like the PyTorch example).
  torch::Tensor forward(const torch::Tensor& x);

  RMSNorm norm1{nullptr}, norm2{nullptr};
  SelfAttention attn{nullptr};
  // ffn = Sequential(fc1, SiLU, fc2), PyTorch's layout: parameters ffn.0.weight, ffn.2.weight.
  torch::nn::Sequential ffn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};

 private:
  bool float8_ = false;
  ops::Float8Scaling float8_scaling_ = ops::Float8Scaling::tensorwise;
};
TORCH_MODULE(TransformerBlock);

class MiniLLMImpl : public torch::nn::Module {
 public:
  // Runs right after block `index` is built, before the next module is: fully_shard it there
  // and a rank never holds more than one full block (start-up without the full model). The
  // random numbers are drawn in the same order either way, so the initial values equal the
  // unsharded model's of the same seed.
  using BlockBuilt = std::function<void(int64_t index, fsdp::Unit<TransformerBlock>& block)>;

  explicit MiniLLMImpl(const Config& config, const BlockBuilt& on_block_built = nullptr);
  // tokens: [batch, seq] int64 -> logits [batch, seq, output_size()].
  torch::Tensor forward(const torch::Tensor& tokens);
  // The mean cross-entropy of the logits forward gives against `targets` ([batch, seq], -100
  // not counted), with the head and the loss fused (ops::linear_cross_entropy: the [tokens,
  // output_size()] logits never exist; chunks of `chunk_tokens`, 0: automatic). Call it
  // through the root unit (`root.call(&MiniLLMImpl::fused_loss, tokens, targets, 0)`), which
  // gathers the root's parameters as forward does.
  torch::Tensor fused_loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                           int64_t chunk_tokens = 0);

  torch::nn::Embedding embed{nullptr};
  // The blocks, registered as the children of a ModuleList named "layers" (PyTorch's names).
  std::vector<fsdp::Unit<TransformerBlock>> layers;
  // Untied: a Linear. Tied: a parameterless module holding embed.weight as its "weight".
  torch::nn::Linear head{nullptr};
  std::shared_ptr<torch::nn::Module> tied_head;
};
TORCH_MODULE(MiniLLM);

// Model FLOPs per trained token, the reference's formula: 6 x matmul parameters plus attention
// scores (PaLM appendix B).
double train_flops_per_token(const Config& config, int64_t seq);

// Parameters of the model (each tensor once: a tied head adds none), without building it.
int64_t parameter_count(const Config& config);

}  // namespace fsdp::models::minillm
