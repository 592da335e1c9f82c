// The Llama model: transformers' names and shapes, HF's init, a forward equal to a naive
// implementation written from the formulas, causality, and the model sharded layer by layer as
// it is built giving the unsharded model's logits and gradients. (The forward against
// transformers itself: tests/reference/llama_logits_check.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <unordered_set>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

using torch::Tensor;

// Each tensor once, under its first name (what a state dict and a Hugging Face file hold).
std::vector<std::pair<std::string, Tensor>> unique_named(torch::nn::Module& m) {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const void*> seen;
  for (const auto& p : m.named_parameters()) {
    if (seen.insert(p.value().unsafeGetTensorImpl()).second) out.emplace_back(p.key(), p.value());
  }
  return out;
}

TEST(LlamaModel, NamesAndShapesAreTransformers) {
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    c.attention_bias = true;
    auto model = build_seeded(c, 1);
    auto params = unique_named(*model);
    auto want = llama::parameter_shapes(c);
    ASSERT_EQ(params.size(), want.size());
    int64_t numel = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(params[i].first, want[i].first);
      EXPECT_EQ(params[i].second.sizes().vec(), want[i].second) << want[i].first;
      numel += params[i].second.numel();
    }
    EXPECT_EQ(numel, llama::parameter_count(c));
    EXPECT_EQ(params.front().first, "model.embed_tokens.weight");
    EXPECT_EQ(params[1].first, "model.layers.0.self_attn.q_proj.weight");
    EXPECT_EQ(params[2].first, "model.layers.0.self_attn.q_proj.bias");
    if (tied) {
      // One tensor, two names: the head is the embedding.
      auto all = model->named_parameters();
      ASSERT_TRUE(all.contains("lm_head.weight"));
      EXPECT_TRUE(all["lm_head.weight"].is_same(all["model.embed_tokens.weight"]));
    } else {
      EXPECT_EQ(params.back().first, "lm_head.weight");
    }
    EXPECT_TRUE(model->named_buffers().is_empty()) << "no buffers: the state dict is the file";
  }
  // Qwen2: biases on q, k, v only.
  auto q = tiny_llama();
  q.model_type = "qwen2";
  auto names = llama::parameter_names(q);
  auto has = [&](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  EXPECT_TRUE(has("model.layers.1.self_attn.k_proj.bias"));
  EXPECT_FALSE(has("model.layers.1.self_attn.o_proj.bias"));
}

TEST(LlamaModel, InitIsHuggingFaces) {
  auto c = tiny_llama();
  c.initializer_range = 0.05;
  c.attention_bias = c.mlp_bias = true;
  c.pad_token_id = 7;
  auto model = build_seeded(c, 3);
  for (const auto& [name, p] : unique_named(*model)) {
    if (name.find("norm") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::ones_like(p))) << name;
    } else if (name.find(".bias") != std::string::npos) {
      EXPECT_TRUE(torch::equal(p, torch::zeros_like(p))) << name;
    } else {
      EXPECT_NEAR(p.std().item<double>(), 0.05, 0.005) << name;
      EXPECT_NEAR(p.mean().item<double>(), 0.0, 0.005) << name;
    }
  }
  EXPECT_TRUE(torch::equal(model->model->embed_tokens->weight[7], torch::zeros({56})));
  // Deterministic from torch's seed, and independent of the build dtype beyond the cast.
  auto again = build_seeded(c, 3);
  llama::BuildOptions bf16;
  bf16.dtype = torch::kBFloat16;
  auto half = build_seeded(c, 3, bf16);
  auto a = unique_named(*model), b = unique_named(*again), h = unique_named(*half);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_TRUE(torch::equal(a[i].second.to(torch::kBFloat16), h[i].second)) << a[i].first;
  }
}

// The forward written from the formulas (llama.h's comment), with none of model.cpp's code:
// explicit softmax over a causal mask, the key/value heads repeated, rotary angles in double.
Tensor naive_logits(llama::LlamaForCausalLM& m, const Tensor& tokens) {
  const auto& c = m->config();
  const int64_t B = tokens.size(0), L = tokens.size(1), H = c.num_attention_heads,
                K = c.num_key_value_heads, hd = c.head_size();
  auto P = m->named_parameters();
  auto get = [&](const std::string& n) { return P[n]; };
  auto linear = [&](const Tensor& x, const std::string& n) {
    auto y = torch::matmul(x, get(n + ".weight").t());
    return P.contains(n + ".bias") ? y + get(n + ".bias") : y;
  };
  auto rms = [&](const Tensor& x, const std::string& n) {
    return x / torch::sqrt((x * x).mean(-1, true) + c.rms_norm_eps) * get(n);
  };
  auto angles = torch::empty({L, hd}, torch::kDouble);
  for (int64_t p = 0; p < L; ++p) {
    for (int64_t j = 0; j < hd; ++j) {
      angles[p][j] = p * std::pow(c.rope_theta, -2.0 * (j % (hd / 2)) / hd);
    }
  }
  auto cos = angles.cos().to(torch::kFloat), sin = angles.sin().to(torch::kFloat);
  auto rotate = [&](const Tensor& x) {  // x [B, heads, L, hd]
    auto x1 = x.narrow(-1, 0, hd / 2), x2 = x.narrow(-1, hd / 2, hd / 2);
    return x * cos + torch::cat({-x2, x1}, -1) * sin;
  };
  auto mask = torch::ones({L, L}, torch::kBool).triu(1);
  auto x = get("model.embed_tokens.weight").index_select(0, tokens.flatten()).view({B, L, -1});
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    auto h = rms(x, p + "input_layernorm.weight");
    auto q = rotate(linear(h, p + "self_attn.q_proj").view({B, L, H, hd}).permute({0, 2, 1, 3}));
    auto k = rotate(linear(h, p + "self_attn.k_proj").view({B, L, K, hd}).permute({0, 2, 1, 3}));
    auto v = linear(h, p + "self_attn.v_proj").view({B, L, K, hd}).permute({0, 2, 1, 3});
    k = k.repeat_interleave(H / K, 1);
    v = v.repeat_interleave(H / K, 1);
    auto scores = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(hd));
    auto weights = torch::softmax(scores.masked_fill(mask, -INFINITY), -1);
    auto o = torch::matmul(weights, v).permute({0, 2, 1, 3}).reshape({B, L, H * hd});
    x = x + linear(o, p + "self_attn.o_proj");
    auto g = rms(x, p + "post_attention_layernorm.weight");
    x = x + linear(torch::silu(linear(g, p + "mlp.gate_proj")) * linear(g, p + "mlp.up_proj"),
                   p + "mlp.down_proj");
  }
  x = rms(x, "model.norm.weight");
  return torch::matmul(x, get("lm_head.weight").t());
}

double rel_error(const Tensor& got, const Tensor& want) {
  return ((got.to(torch::kFloat) - want).abs().max() / want.abs().max()).item<double>();
}

TEST(LlamaModel, ForwardIsTheFormulas) {
  torch::NoGradGuard no_grad;
  struct Case {
    const char* name;
    llama::Config c;
  };
  auto gqa = tiny_llama();
  auto tied = tiny_llama(/*tied=*/true);
  tied.attention_bias = tied.mlp_bias = true;
  tied.head_dim = 20;  // not 56 / 4
  tied.rope_theta = 500.0;
  tied.num_key_value_heads = 1;
  auto mha = tiny_llama();
  mha.num_key_value_heads = 4;
  for (const auto& [name, c] :
       {Case{"gqa", gqa}, Case{"tied, biases, head_dim 20, mqa", tied}, Case{"mha", mha}}) {
    auto model = build_seeded(c, 5);
    if (c.attention_bias) {  // non-zero biases, so that they count
      for (auto& p : model->parameters()) {
        if (p.dim() == 1) p.normal_(0.0, 0.1);
      }
    }
    auto tokens = torch::randint(c.vocab_size, {3, 17}, torch::kLong);
    auto logits = model->forward(tokens);
    ASSERT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 17, c.vocab_size}));
    EXPECT_EQ(logits.scalar_type(), torch::kFloat);
    const double err = rel_error(logits, naive_logits(model, tokens));
    std::cout << name << ": max |diff| / max |logit| " << err << "\n";
    EXPECT_LT(err, 1e-5) << name;
    EXPECT_GT(logits.std(-1).mean().item<double>(), 0.05) << "logits that vary";
  }
}

TEST(LlamaModel, IsCausalAndTakesOnlyInt64Tokens) {
  torch::NoGradGuard no_grad;
  auto model = build_seeded(tiny_llama(), 2);
  auto tokens = torch::randint(1001, {2, 12}, torch::kLong);
  auto changed = tokens.clone();
  changed.select(1, 8).fill_(0);
  auto a = model->forward(tokens), b = model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 8), b.narrow(1, 0, 8), 0, 0));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 8, 4), b.narrow(1, 8, 4)));
  expect_error_containing<InvalidArgument>([&] { model->forward(tokens.to(torch::kInt)); },
                                           "tokens must be [batch, seq] int64");
  expect_error_containing<InvalidArgument>([&] { model->forward(tokens.flatten()); },
                                           "tokens must be [batch, seq] int64");
  llama::Config bad = tiny_llama();
  bad.num_key_value_heads = 3;
  expect_error_containing<InvalidArgument>([&] { llama::build_llama(bad); },
                                           "num_attention_heads 4 does not divide by "
                                           "num_key_value_heads 3");
}

TEST(LlamaModel, PaddingRowGetsNoGradient) {
  auto c = tiny_llama();
  c.pad_token_id = 5;
  auto model = build_seeded(c, 4);
  auto tokens = torch::tensor({{5, 1, 5, 2}}, torch::kLong);
  model->forward(tokens).sum().backward();
  auto g = model->model->embed_tokens->weight.grad();
  EXPECT_TRUE(torch::equal(g[5], torch::zeros({56})));
  EXPECT_GT(g[1].abs().sum().item<double>(), 0);
}

// Sharded layer by layer as it is built (no rank holds the whole model), then the root: the
// unsharded model's logits bit for bit and its gradients.
TEST(LlamaModel, ShardedAsBuiltEqualsUnsharded) {
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    auto reference = build_seeded(c, 9);
    auto tokens = torch::randint(c.vocab_size, {2, 13}, torch::kLong);
    auto targets = torch::randint(c.vocab_size, {2, 13}, torch::kLong);
    auto ref_logits = reference->forward(tokens);
    loss_of(ref_logits, targets, c.vocab_size).backward();
    auto ref_params = unique_named(*reference);
    for (int world : {2, 3}) {
      run_local_ranks(
          world,
          [&](const ProcessGroupPtr& pg) {
            std::vector<int64_t> built;
            llama::BuildOptions o;
            o.on_layer_built = [&](int64_t i, Unit<llama::DecoderLayer>& layer) {
              built.push_back(i);
              fully_shard(layer, pg);
            };
            auto model = build_seeded(c, 9, o);
            EXPECT_EQ(built, (std::vector<int64_t>{0, 1}));
            auto root = fully_shard(model, pg);
            auto logits = root(tokens);
            EXPECT_TRUE(torch::equal(logits, ref_logits)) << "world " << world;
            loss_of(logits, targets, c.vocab_size).backward();
            auto params = unique_named(*model);
            ASSERT_EQ(params.size(), ref_params.size());
            for (size_t i = 0; i < params.size(); ++i) {
              auto full = gather_full(pg, params[i].second.grad(), ref_params[i].second.size(0));
              EXPECT_LT(rel_error(full, ref_params[i].second.grad()), 1e-5)
                  << params[i].first << " world " << world << (tied ? " tied" : "");
            }
          },
          test_options());
    }
  }
}

TEST(LlamaModel, Bf16ComputeGivesBf16Logits) {
  auto c = tiny_llama();
  llama::BuildOptions o;
  o.dtype = torch::kBFloat16;
  auto model = build_seeded(c, 6, o);
  auto fp32 = build_seeded(c, 6);
  auto tokens = torch::randint(c.vocab_size, {2, 9}, torch::kLong);
  auto logits = model->forward(tokens);
  EXPECT_EQ(logits.scalar_type(), torch::kBFloat16);
  EXPECT_LT(rel_error(logits, fp32->forward(tokens).detach()), 0.05);
  // Mixed precision through FSDP: bf16 compute over fp32 shards.
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        MixedPrecisionPolicy mp;
        mp.param_dtype = torch::kBFloat16;
        llama::BuildOptions bo;
        bo.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
          FullyShardOptions fo;
          fo.mp_policy = mp;
          fully_shard(layer, pg, fo);
        };
        auto m = build_seeded(c, 6, bo);
        FullyShardOptions fo;
        fo.mp_policy = mp;
        auto root = fully_shard(m, pg, fo);
        auto out = root(tokens);
        EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
        EXPECT_TRUE(torch::equal(out, logits));
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::testing
