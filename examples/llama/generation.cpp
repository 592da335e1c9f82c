#include "generation.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "fsdp/models/llama_generate.h"
#include "text_prompt.h"

namespace llama {

namespace ll = fsdp::models::llama;

namespace {

// The end-of-sequence ids generation stops at, as transformers' generate takes them: the
// directory's generation_config.json (which may list more, such as an instruct model's
// end-of-turn id), else config.json's.
std::vector<int64_t> eos_ids(const Options& o, const ll::Config& config) {
  const std::string path = o.hf_dir + "/generation_config.json";
  if (o.hf_dir.empty() || !std::ifstream(path)) return config.eos_token_ids;
  try {
    const auto j = nlohmann::json::parse(std::ifstream(path));
    if (!j.contains("eos_token_id") || j["eos_token_id"].is_null()) return config.eos_token_ids;
    const auto& e = j["eos_token_id"];
    if (e.is_number_integer()) return {e.get<int64_t>()};
    return e.get<std::vector<int64_t>>();
  } catch (const std::exception& e) {
    throw fsdp::InvalidArgument(
        fmt::format("{}: eos_token_id is not an id or a list of ids ({})", path, e.what()));
  }
}

}  // namespace

int generate(const Options& o, Built& b, const fsdp::Distributed& dist) {
  ll::GenerateOptions g;
  g.max_new_tokens = o.max_new_tokens;
  g.temperature = o.temperature;
  g.top_k = o.top_k;
  g.top_p = o.top_p;
  g.seed = o.train.seed;
  g.use_cache = !o.no_cache;
  if (!o.ignore_eos) g.eos_token_ids = eos_ids(o, b.config);
  g.group = dist.group;
  g.device = dist.device;
  // --generate TEXT and --chat: encoded here, decoded below (text_prompt.h).
  std::function<std::string(const std::vector<int64_t>&)> decode;
  auto prompt = o.generate_ids;
  if (!o.generate_text.empty()) {
    auto text = encode_text_prompt(o);
    prompt = std::move(text.ids);
    decode = std::move(text.decode);
    if (dist.group->rank() == 0) {
      fmt::print("prompt: {} tokens: {}\n", prompt.size(), fmt::join(prompt, " "));
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const auto ids = ll::generate(b.root, *b.model, prompt, g);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (dist.group->rank() == 0) {
    fmt::print("generated {} tokens ({}, {}) in {:.2f} s: {}\n", ids.size(),
               o.temperature > 0 ? fmt::format("temperature {:g}", o.temperature) : "greedy",
               o.no_cache ? "no cache" : "cache", seconds, fmt::join(ids, " "));
    if (decode) fmt::print("text: {}\n", nlohmann::json(decode(ids)).dump());
  }
  return 0;
}

}  // namespace llama
