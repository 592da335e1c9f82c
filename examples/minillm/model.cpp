#include "model.h"

namespace minillm {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  return x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_) * weight;
}

TransformerBlockImpl::TransformerBlockImpl(int64_t dim, int64_t heads) {
  norm1 = register_module("norm1", RMSNorm(dim));
  norm2 = register_module("norm2", RMSNorm(dim));
  attn = register_module(
      "attn", torch::nn::MultiheadAttention(torch::nn::MultiheadAttentionOptions(dim, heads)));
  fc1 =
      register_module("fc1", torch::nn::Linear(torch::nn::LinearOptions(dim, 4 * dim).bias(false)));
  fc2 =
      register_module("fc2", torch::nn::Linear(torch::nn::LinearOptions(4 * dim, dim).bias(false)));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x) {
  // libtorch's MultiheadAttention is sequence-first: [seq, batch, dim].
  auto h = norm1(x).transpose(0, 1);
  auto a = std::get<0>(attn->forward(h, h, h, /*key_padding_mask=*/{}, /*need_weights=*/false));
  auto y = x + a.transpose(0, 1);
  return y + fc2(torch::silu(fc1(norm2(y))));
}

MiniLLMImpl::MiniLLMImpl(const Config& c) {
  embed = register_module("embed", torch::nn::Embedding(c.vocab, c.dim));
  for (int64_t i = 0; i < c.layers; ++i) {
    layers.push_back(
        register_module("layer" + std::to_string(i), TransformerBlock(c.dim, c.heads)));
  }
  head = register_module(
      "head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.output_size()).bias(false)));
}

torch::Tensor MiniLLMImpl::forward(const torch::Tensor& tokens) {
  auto x = embed(tokens);
  for (auto& layer : layers) x = layer(x);
  return head(x);
}

double train_flops_per_token(const Config& c, int64_t seq) {
  double block = 4.0 * c.dim * c.dim + 8.0 * c.dim * c.dim;
  double matmul_params = c.layers * block + static_cast<double>(c.vocab) * c.dim;
  return 6.0 * matmul_params + 12.0 * c.layers * c.dim * seq;
}

}  // namespace minillm
