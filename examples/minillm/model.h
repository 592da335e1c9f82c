// MiniLLM: the model of the PyTorch FSDP2 example (../shared/anchors/py_minillm.py), in libtorch.
// Token embedding; blocks of RMSNorm, multi-head attention, residual, RMSNorm, SiLU MLP
// (dim -> 4 dim -> dim, no bias), residual; output head dim -> vocab without bias.
//
// The blocks are held as fsdp::Unit<TransformerBlock>: a plain pass-through until fully_shard
// is applied, so the same class is the single-process reference and the sharded model.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "fsdp/fully_shard.h"

namespace minillm {

struct Config {
  int64_t vocab = 32000;
  int64_t dim = 256;
  int64_t layers = 4;
  int64_t heads = 8;
  // Rows of the output head; 0 means vocab (a language model). Tests use a small classifier
  // head of a size that divides by nothing.
  int64_t outputs = 0;
  int64_t output_size() const { return outputs > 0 ? outputs : vocab; }
};

// x * rsqrt(mean(x^2) + eps) * weight; libtorch has no RMSNorm before 2.4.
class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class TransformerBlockImpl : public torch::nn::Module {
 public:
  TransformerBlockImpl(int64_t dim, int64_t heads);
  // x: [batch, seq, dim] (batch first, like the PyTorch example).
  torch::Tensor forward(const torch::Tensor& x);

  RMSNorm norm1{nullptr}, norm2{nullptr};
  torch::nn::MultiheadAttention attn{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(TransformerBlock);

class MiniLLMImpl : public torch::nn::Module {
 public:
  explicit MiniLLMImpl(const Config& config);
  // tokens: [batch, seq] int64 -> logits [batch, seq, output_size()].
  torch::Tensor forward(const torch::Tensor& tokens);

  torch::nn::Embedding embed{nullptr};
  std::vector<fsdp::Unit<TransformerBlock>> layers;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(MiniLLM);

// Model FLOPs per trained token, the reference's formula: 6 x matmul parameters plus attention
// scores (PaLM appendix B).
double train_flops_per_token(const Config& config, int64_t seq);

}  // namespace minillm
