// Generation's pieces (fsdp/models/llama_generate.h): the cache of keys and values gives the
// logits of the whole-sequence forward, one token at a time or in chunks after cached ones (the
// mask path); the sampler's top-k 1 and a tiny top-p are greedy. Greedy tokens against
// transformers' generate: tests/examples/llama_generate.sh.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "fsdp/models/llama.h"
#include "fsdp/models/llama_generate.h"
#include "models/llama_test_util.h"

namespace fsdp::testing {
namespace {

namespace llama = fsdp::models::llama;

TEST(LlamaGenerate, CachedForwardsGiveTheWholeSequencesLogits) {
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    auto model = build_seeded(c, 3);
    torch::NoGradGuard no_grad;
    auto tokens = torch::randint(c.vocab_size, {2, 11}, torch::kLong);
    const auto whole = model->forward(tokens);
    std::vector<llama::LayerCache> cache(model->model->layers.size());
    int64_t cached = 0;
    model->model->set_cache(&cache, &cached);
    // A prefill of 5, a chunk of 3 after them (the explicit mask), then one token at a time.
    std::vector<std::pair<int64_t, int64_t>> pieces{{0, 5}, {5, 3}, {8, 1}, {9, 1}, {10, 1}};
    for (const auto& [first, n] : pieces) {
      auto got = model->forward(tokens.narrow(1, first, n));
      auto want = whole.narrow(1, first, n);
      EXPECT_TRUE(torch::allclose(got, want, 1e-5, 1e-5))
          << "tokens " << first << ".." << first + n << (tied ? " tied" : "") << ": "
          << (got - want).abs().max().item<double>();
    }
    EXPECT_EQ(cached, 11);
    EXPECT_EQ(cache[0].keys.size(2), 11);
    model->model->set_cache(nullptr, nullptr);
    EXPECT_TRUE(torch::equal(model->forward(tokens), whole)) << "the cache is off again";
  }
}

TEST(LlamaGenerate, TopKOneAndATinyTopPAreGreedy) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  auto logits = torch::randn({50}, gen);
  const int64_t best = logits.argmax().item<int64_t>();
  llama::GenerateOptions greedy;
  EXPECT_EQ(llama::next_token(logits, greedy, gen), best);
  llama::GenerateOptions k1;
  k1.temperature = 1;
  k1.top_k = 1;
  llama::GenerateOptions p;
  p.temperature = 1;
  p.top_p = 1e-6;
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(llama::next_token(logits, k1, gen), best);
    EXPECT_EQ(llama::next_token(logits, p, gen), best);
  }
  // Sampling at a high temperature leaves the argmax sometimes, and never the top k.
  llama::GenerateOptions hot;
  hot.temperature = 10;
  hot.top_k = 5;
  const auto top5 = std::get<1>(logits.topk(5));
  bool left = false;
  for (int i = 0; i < 200; ++i) {
    const int64_t t = llama::next_token(logits, hot, gen);
    EXPECT_TRUE((top5 == t).any().item<bool>()) << t;
    left = left || t != best;
  }
  EXPECT_TRUE(left);
}

}  // namespace
}  // namespace fsdp::testing
