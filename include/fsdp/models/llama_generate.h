// Text generation with a Llama model: a prompt's tokens in, new tokens out, one forward per
// token after the prompt's, with a cache of keys and values (transformers' generate with its
// DynamicCache), greedy or sampled (temperature, top-k, top-p, as transformers' warpers).
//
//   auto out = llama::generate(root, *model, prompt_ids, {.max_new_tokens = 32});
//
// The model may be sharded (fully_shard: each unit gathers for every forward, as in training),
// split over a tensor-parallel group (the logits are gathered) or whole. Every rank of the
// model's groups calls generate with the same prompt and options; they draw the same tokens
// (the same logits and the same seeded generator), and with `group` set rank 0's draw is
// broadcast so that they cannot differ.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/torch_modules.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp::models::llama {

struct GenerateOptions {
  int64_t max_new_tokens = 32;
  // <= 0: greedy (the most likely token). Otherwise the logits are divided by it and a token is
  // drawn from the softmax after top_k and top_p (transformers' order: temperature, top-k,
  // top-p; unlike transformers' generate, whose top_k defaults to 50, top_k 0 keeps every
  // token). Sampling runs on the host.
  double temperature = 0;
  int64_t top_k = 0;   // keep the k most likely tokens (0: all)
  double top_p = 1.0;  // keep the most likely tokens whose probabilities sum to top_p (1: all)
  uint64_t seed = 0;   // the sampling generator's seed
  // Off: every step runs the whole sequence again (no cache); the same tokens, slower.
  bool use_cache = true;
  // Generation stops after any of these (it is included in the output).
  std::vector<int64_t> eos_token_ids;
  // When set, rank 0's token is broadcast over it at each step.
  ProcessGroupPtr group;
  // Where the tokens go: the device the units compute on. Unset: the embedding weight's (set it
  // under CPU offload, where the weights live in host memory between forwards).
  std::optional<torch::Device> device;
};

// The new tokens after `prompt` (at least one token id, each in the vocabulary), at most
// options.max_new_tokens of them. `root` is the model as the program calls it (its
// fsdp::Unit, sharded or not), `model` the module itself. Runs without gradients and in
// evaluation mode (training mode is restored after, if it was on); the model's cache is
// removed when it returns or throws. InvalidArgument for an empty prompt, a token
// outside the vocabulary, options out of range, or a model with sequence parallelism (a
// single new token does not split over the sequence).
std::vector<int64_t> generate(fsdp::Unit<LlamaForCausalLM>& root, LlamaForCausalLMImpl& model,
                              const std::vector<int64_t>& prompt,
                              const GenerateOptions& options = {});

// The token drawn from `logits` ([vocab], any floating dtype) by `options` (greedy, or sampled
// with `generator`): exposed for tests.
int64_t next_token(const torch::Tensor& logits, const GenerateOptions& options,
                   at::Generator& generator);

}  // namespace fsdp::models::llama
