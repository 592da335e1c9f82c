// The C++ side of tests/reference/llama_logits_check.py: loads a Hugging Face directory (or
// builds a random model from a config.json), sharded over W thread ranks, and writes the fp32
// logits of the first K validation windows of a token file to a safetensors file ("logits"
// [K, seq, vocab]); optionally saves the model as a Hugging Face directory (save_hf_checkpoint).
//
//   llama_logits (--hf-dir DIR | --config config.json [--seed S]) --tokens FILE --seq N
//                --count K --out OUT.safetensors [--tokens-dtype uint16|uint32] [--world W]
//                [--batch B] [--export DIR [--export-dtype fp32|bf16] [--max-shard-bytes N]]
#include <iostream>
#include <map>
#include <mutex>
#include <string>

#include "fsdp/data/token_file.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama.h"
#include "support/torch_api.h"

namespace llama = fsdp::models::llama;

namespace {

std::map<std::string, std::string> parse_args(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i < argc; ++i) {
    std::string key = argv[i];
    if (key.rfind("--", 0) != 0 || i + 1 >= argc) {
      throw fsdp::InvalidArgument("expected --key value pairs, got " + key);
    }
    args[key.substr(2)] = argv[++i];
  }
  return args;
}

std::string get(const std::map<std::string, std::string>& a, const std::string& key,
                const std::string& fallback = "") {
  auto it = a.find(key);
  if (it != a.end()) return it->second;
  if (fallback.empty()) throw fsdp::InvalidArgument("--" + key + " is required");
  return fallback;
}

void run(const std::map<std::string, std::string>& a) {
  const int world = std::stoi(get(a, "world", "1"));
  const int64_t seq = std::stoll(get(a, "seq")), count = std::stoll(get(a, "count"));
  const int64_t batch = std::stoll(get(a, "batch", "8"));
  const bool from_dir = a.count("hf-dir") > 0;
  const llama::Config config =
      from_dir ? llama::read_hf_config(get(a, "hf-dir")) : llama::read_hf_config(get(a, "config"));
  fsdp::data::TokenFileOptions to;
  to.dtype = fsdp::data::parse_token_dtype(get(a, "tokens-dtype", "uint16"));
  to.vocab = config.vocab_size;
  to.seq = seq;
  fsdp::data::TokenFile tokens(get(a, "tokens"), to);
  if (count < 1 || count > tokens.val_window_count()) {
    throw fsdp::InvalidArgument("--count " + std::to_string(count) + ": the file holds " +
                                std::to_string(tokens.val_window_count()) + " windows");
  }
  std::mutex build;  // thread ranks share torch's generator: one model built at a time
  fsdp::run_local_ranks(world, [&](const fsdp::ProcessGroupPtr& pg) {
    torch::set_num_threads(1);
    llama::LlamaForCausalLM model{nullptr};
    auto shard_layer = [&](int64_t, fsdp::Unit<llama::DecoderLayer>& layer) {
      fsdp::fully_shard(layer, pg);
    };
    if (from_dir) {
      llama::HfLoadOptions o;
      o.on_layer_built = shard_layer;
      o.on_model_built = [&](llama::LlamaForCausalLM& m) { fsdp::fully_shard(m, pg); };
      model = llama::load_hf_model(get(a, "hf-dir"), pg, o).model;
    } else {
      std::lock_guard<std::mutex> lock(build);
      torch::manual_seed(std::stoull(get(a, "seed", "0")));
      llama::BuildOptions o;
      o.on_layer_built = shard_layer;
      model = llama::build_llama(config, o);
      fsdp::fully_shard(model, pg);
    }
    fsdp::Unit<llama::LlamaForCausalLM> root(model);
    std::vector<torch::Tensor> parts;
    {
      torch::NoGradGuard no_grad;
      for (int64_t first = 0; first < count; first += batch) {
        auto windows = tokens.val_batch(first, std::min(batch, count - first));
        parts.push_back(root(windows.inputs).to(torch::kFloat));
      }
    }
    if (pg->rank() == 0) {
      fsdp::write_safetensors(get(a, "out"), {{"logits", torch::cat(parts).contiguous()}});
    }
    if (a.count("export")) {
      llama::HfSaveOptions o;
      o.dtype = get(a, "export-dtype", "fp32") == "bf16" ? torch::kBFloat16 : torch::kFloat;
      o.max_shard_bytes = std::stoll(get(a, "max-shard-bytes", "5000000000"));
      llama::save_hf_checkpoint(get(a, "export"), *model, config, pg, o);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  try {
    run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::cerr << "llama_logits: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
