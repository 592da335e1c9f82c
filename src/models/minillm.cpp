#include "fsdp/models/minillm.h"

#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>

#include <limits>
#include <tuple>

#include "fsdp/errors.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/fused.h"
#include "fsdp/ops/linear_cross_entropy.h"

namespace fsdp::models::minillm {

namespace {

// torch::rms_norm's eps when none is given, for the inputs the kernel takes (float, bf16, half):
// the machine epsilon of float, the type it computes in (measured on 2.11: not bf16's own
// epsilon, whatever nn.RMSNorm's documentation says), so that the kernel's norm is the module's.
constexpr double kKernelEps = std::numeric_limits<float>::epsilon();

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim) { weight = register_parameter("weight", torch::ones({dim})); }

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // On a GPU with fsdp's kernels, one kernel each way that keeps a float per row for the
  // backward; elsewhere PyTorch's own (its CPU bf16 path rounds differently from the kernel's
  // ATen twin, and the CPU is where MiniLLM equals the FSDP2 reference to the last digit).
  if (ops::rms_norm_uses_kernel(x, weight)) return ops::rms_norm(x, weight, kKernelEps);
  return torch::rms_norm(x, {weight.size(0)}, weight, /*eps=*/std::nullopt);
}

SelfAttentionImpl::SelfAttentionImpl(int64_t dim, int64_t heads, bool float8,
                                     ops::Float8Scaling scaling)
    : heads_(heads), float8_(float8), float8_scaling_(scaling) {
  TORCH_CHECK(dim % heads == 0, "attention: dim ", dim, " is not divisible by heads ", heads);
  in_proj_weight = register_parameter("in_proj_weight", torch::empty({3 * dim, dim}));
  in_proj_bias = register_parameter("in_proj_bias", torch::zeros({3 * dim}));
  out_proj = register_module("out_proj", torch::nn::Linear(dim, dim));
  // nn.MultiheadAttention._reset_parameters: Xavier for the packed projection, zero biases.
  torch::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(in_proj_weight);
  out_proj->bias.zero_();
}

torch::Tensor SelfAttentionImpl::project(const torch::Tensor& x, const torch::Tensor& weight,
                                         const torch::Tensor& bias) const {
  if (!float8_) return torch::nn::functional::linear(x, weight, bias);
  return ops::float8_linear(x, weight, bias, {}, float8_scaling_);
}

torch::Tensor SelfAttentionImpl::forward(const torch::Tensor& x) {
  if (ops::cuda_kernels_run_on(x)) return forward_batch_first(x);
  const int64_t batch = x.size(0), seq = x.size(1), dim = x.size(2), head_dim = dim / heads_;
  // The steps of torch.nn.functional.multi_head_attention_forward (batch_first, q is k is v,
  // need_weights=False) in PyTorch 2.11, op for op, so both programs run the same kernels.
  auto h = x.transpose(0, 1);  // [seq, batch, dim]
  auto proj = project(h, in_proj_weight, in_proj_bias)
                  .unflatten(-1, {3, dim})
                  .unsqueeze(0)
                  .transpose(0, -2)
                  .squeeze(-2)
                  .contiguous();  // [3, seq, batch, dim]
  auto heads_first = [&](const torch::Tensor& t) {
    return t.view({seq, batch * heads_, head_dim})
        .transpose(0, 1)
        .view({batch, heads_, seq, head_dim});
  };
  auto attn = torch::scaled_dot_product_attention(heads_first(proj[0]), heads_first(proj[1]),
                                                  heads_first(proj[2]));
  auto merged = attn.permute({2, 0, 1, 3}).contiguous().view({batch * seq, dim});
  return project(merged, out_proj->weight, out_proj->bias).view({seq, batch, dim}).transpose(0, 1);
}

torch::Tensor SelfAttentionImpl::forward_batch_first(const torch::Tensor& x) {
  const int64_t batch = x.size(0), seq = x.size(1), dim = x.size(2), head_dim = dim / heads_;
  // q, k and v as views of the packed projection [batch, seq, 3, heads, head_dim]: the last
  // dimension is contiguous, which is all SDPA's flash and cuDNN kernels ask. unbind, not three
  // selects: its backward stacks the three gradients straight into the projection's layout,
  // where each select's would fill a zeroed buffer of the whole projection and add them.
  const auto qkv = project(x, in_proj_weight, in_proj_bias)
                       .view({batch, seq, 3, heads_, head_dim})
                       .unbind(2);  // 3 x [batch, seq, heads, head_dim]
  const auto attn = torch::scaled_dot_product_attention(
      qkv[0].transpose(1, 2), qkv[1].transpose(1, 2), qkv[2].transpose(1, 2));
  // SDPA's GPU kernels write their output as [batch, seq, heads, head_dim] (flash and the
  // memory-efficient one always, cuDNN in q's layout, which is that here): the reshape is then
  // a view (a copy only where SDPA falls back to its math kernel).
  const auto merged = attn.transpose(1, 2).reshape({batch * seq, dim});
  return project(merged, out_proj->weight, out_proj->bias).view({batch, seq, dim});
}

TransformerBlockImpl::TransformerBlockImpl(int64_t dim, int64_t heads, bool float8,
                                           ops::Float8Scaling scaling, bool float8_attention)
    : float8_(float8), float8_scaling_(scaling) {
  if (!float8 && scaling != ops::Float8Scaling::tensorwise) {
    throw InvalidArgument("MiniLLM float8: rowwise scaling but float8 is off");
  }
  if (!float8 && float8_attention) {
    throw InvalidArgument("MiniLLM float8: float8_attention but float8 is off");
  }
  if (float8) {
    const auto why = ops::float8_linear_unsupported(dim, 4 * dim);
    if (!why.empty()) throw InvalidArgument("MiniLLM float8: the feed-forward is " + why);
  }
  norm1 = register_module("norm1", RMSNorm(dim));
  norm2 = register_module("norm2", RMSNorm(dim));
  attn = register_module("attn", SelfAttention(dim, heads, float8_attention, scaling));
  fc1 = torch::nn::Linear(torch::nn::LinearOptions(dim, 4 * dim).bias(false));
  fc2 = torch::nn::Linear(torch::nn::LinearOptions(4 * dim, dim).bias(false));
  ffn = register_module("ffn", torch::nn::Sequential(fc1, torch::nn::SiLU(), fc2));
}

torch::Tensor TransformerBlockImpl::forward(const torch::Tensor& x) {
  const auto a = attn(norm1(x));
  // y = x + a and norm2(y): one kernel reading x and a once where the norm's kernel runs.
  torch::Tensor y, n;
  if (ops::rms_norm_uses_kernel(x, norm2->weight) && a.scalar_type() == x.scalar_type()) {
    std::tie(y, n) = ops::add_rms_norm(x, a, norm2->weight, kKernelEps);
  } else {
    y = x + a;
    n = norm2(y);
  }
  if (!float8_) return y + ffn->forward(n);
  // ffn's own order (fc1, SiLU, fc2) with the two GEMMs in float8.
  const auto h = torch::silu(ops::float8_linear(n, fc1->weight, {}, {}, float8_scaling_));
  return y + ops::float8_linear(h, fc2->weight, {}, {}, float8_scaling_);
}

MiniLLMImpl::MiniLLMImpl(const Config& c, const BlockBuilt& on_block_built) {
  embed = register_module("embed", torch::nn::Embedding(c.vocab, c.dim));
  auto blocks = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.layers; ++i) {
    TransformerBlock block(c.dim, c.heads, c.float8, c.float8_scaling, c.float8_attention);
    blocks->push_back(block);
    layers.push_back(block);
    if (on_block_built) on_block_built(i, layers.back());
  }
  if (c.tie_embeddings) {
    TORCH_CHECK(c.outputs == 0, "MiniLLM: tie_embeddings needs the head to have vocab rows");
    tied_head = register_module("head", std::make_shared<torch::nn::Module>());
    tied_head->register_parameter("weight", embed->weight);
  } else {
    head = register_module(
        "head", torch::nn::Linear(torch::nn::LinearOptions(c.dim, c.output_size()).bias(false)));
  }
}

torch::Tensor MiniLLMImpl::forward(const torch::Tensor& tokens) {
  auto x = embed(tokens);
  for (auto& layer : layers) x = layer(x);
  return tied_head ? torch::nn::functional::linear(x, embed->weight) : head(x);
}

torch::Tensor MiniLLMImpl::fused_loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                                      int64_t chunk_tokens) {
  auto x = embed(tokens);
  for (auto& layer : layers) x = layer(x);
  const auto& weight = tied_head ? embed->weight : head->weight;
  ops::LinearCrossEntropyOptions options;
  options.chunk_tokens = chunk_tokens;
  return ops::linear_cross_entropy(x.reshape({-1, x.size(-1)}), weight, targets.reshape(-1),
                                   options);
}

double train_flops_per_token(const Config& c, int64_t seq) {
  double block = 4.0 * c.dim * c.dim + 8.0 * c.dim * c.dim;
  double matmul_params = c.layers * block + static_cast<double>(c.vocab) * c.dim;
  return 6.0 * matmul_params + 12.0 * c.layers * c.dim * seq;
}

int64_t parameter_count(const Config& c) {
  const int64_t block = 2 * c.dim                        // norm1, norm2
                        + 3 * c.dim * c.dim + 3 * c.dim  // in_proj weight and bias
                        + c.dim * c.dim + c.dim          // out_proj
                        + 2 * 4 * c.dim * c.dim;         // ffn
  const int64_t head = c.tie_embeddings ? 0 : c.dim * c.output_size();
  return c.vocab * c.dim + c.layers * block + head;
}

}  // namespace fsdp::models::minillm
