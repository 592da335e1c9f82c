// Generation (fsdp/models/llama_generate.h): a prefill of the prompt, then one token per forward
// with the cache of keys and values, or the whole sequence per forward without it.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>

#include "fsdp/models/llama_generate.h"
#include "model_check.h"

namespace fsdp::models::llama {
namespace {

// Evaluation mode (LoRA's dropout off) for the generation; training mode back after, if it
// was on.
class GenerateEvalMode {
 public:
  explicit GenerateEvalMode(torch::nn::Module& model)
      : model_(model), was_training_(model.is_training()) {
    model_.eval();
  }
  ~GenerateEvalMode() {
    if (was_training_) model_.train();
  }
  GenerateEvalMode(const GenerateEvalMode&) = delete;
  GenerateEvalMode& operator=(const GenerateEvalMode&) = delete;

 private:
  torch::nn::Module& model_;
  bool was_training_;
};

// Removes the model's cache however generation ends.
class CacheScope {
 public:
  CacheScope(LlamaModelImpl& model, std::vector<LayerCache>* cache, int64_t* cached)
      : model_(model) {
    model_.set_cache(cache, cached);
  }
  ~CacheScope() { model_.set_cache(nullptr, nullptr); }
  CacheScope(const CacheScope&) = delete;
  CacheScope& operator=(const CacheScope&) = delete;

 private:
  LlamaModelImpl& model_;
};

void check_options(const GenerateOptions& o, const std::vector<int64_t>& prompt, int64_t vocab) {
  FSDP_MODEL_CHECK(!prompt.empty(), "generate: the prompt has no tokens");
  for (size_t i = 0; i < prompt.size(); ++i) {
    FSDP_MODEL_CHECK(prompt[i] >= 0 && prompt[i] < vocab,
                     "generate: prompt token {} is {}, outside the vocabulary of {}", i, prompt[i],
                     vocab);
  }
  FSDP_MODEL_CHECK(o.max_new_tokens >= 0, "generate: max_new_tokens must be >= 0, got {}",
                   o.max_new_tokens);
  FSDP_MODEL_CHECK(o.top_k >= 0, "generate: top_k must be >= 0, got {}", o.top_k);
  FSDP_MODEL_CHECK(o.top_p > 0 && o.top_p <= 1, "generate: top_p must be in (0, 1], got {}",
                   o.top_p);
  FSDP_MODEL_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
                   "generate: the temperature must be a finite number >= 0 (0: greedy), got {}",
                   o.temperature);
}

}  // namespace

int64_t next_token(const torch::Tensor& logits_in, const GenerateOptions& o,
                   at::Generator& generator) {
  torch::NoGradGuard no_grad;
  // On the host: the generator is a CPU one, and every rank and device then draws alike.
  auto logits = logits_in.to(torch::kCPU, torch::kFloat).reshape(-1);
  if (o.temperature <= 0) return logits.argmax().item<int64_t>();
  logits = logits / o.temperature;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (o.top_k > 0 && o.top_k < logits.numel()) {
    // TopKLogitsWarper: below the k-th largest, out.
    const auto kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, neg_inf);
  }
  if (o.top_p < 1) {
    // TopPLogitsWarper: ascending order; the tokens whose cumulative probability stays at or
    // below 1 - top_p are out, the most likely one always kept.
    auto [sorted, order] = logits.sort(/*stable=*/false, /*dim=*/0, /*descending=*/false);
    auto cumulative = sorted.softmax(0).cumsum(0);
    auto remove = cumulative <= (1 - o.top_p);
    remove[-1] = false;
    logits = logits.masked_fill(remove.scatter(0, order, remove), neg_inf);
  }
  auto probs = logits.softmax(0);
  return at::multinomial(probs, 1, /*replacement=*/false, generator).item<int64_t>();
}

std::vector<int64_t> generate(fsdp::Unit<LlamaForCausalLM>& root, LlamaForCausalLMImpl& model,
                              const std::vector<int64_t>& prompt, const GenerateOptions& o) {
  check_options(o, prompt, model.config().vocab_size);
  FSDP_MODEL_CHECK(!model.sequence_parallel(),
                   "generate: the model splits the sequence over its tensor-parallel group "
                   "(sequence parallelism); one new token does not split: build it without");
  torch::NoGradGuard no_grad;
  GenerateEvalMode eval_mode(model);
  // The device the units compute on (under CPU offload the shards, and so the embedding's
  // weight between forwards, are in host memory).
  const auto device = o.device.value_or(model.model->embed_tokens->weight.device());
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  std::vector<int64_t> sequence = prompt, out;
  std::vector<LayerCache> cache(model.model->layers.size());
  int64_t cached = 0;
  CacheScope scope(*model.model, o.use_cache ? &cache : nullptr, &cached);
  for (int64_t step = 0; step < o.max_new_tokens; ++step) {
    // With the cache: the prompt first (prefill), then the last token alone.
    const auto first = o.use_cache ? static_cast<size_t>(cached) : size_t{0};
    auto tokens =
        torch::tensor(std::vector<int64_t>(sequence.begin() + first, sequence.end()), torch::kLong)
            .reshape({1, -1})
            .to(device);
    auto logits = model.full_logits(root(tokens));
    int64_t token = next_token(logits[0][-1], o, generator);
    if (o.group) {
      auto t = torch::tensor({token}, torch::TensorOptions(torch::kLong).device(o.group->device()));
      o.group->broadcast(t, 0)->wait();
      token = t.item<int64_t>();
    }
    sequence.push_back(token);
    out.push_back(token);
    if (std::find(o.eos_token_ids.begin(), o.eos_token_ids.end(), token) != o.eos_token_ids.end()) {
      break;
    }
  }
  return out;
}

}  // namespace fsdp::models::llama
