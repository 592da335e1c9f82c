// train_llama: a Llama-family model (fsdp::models::llama: Llama 2/3, Mistral- and Qwen2-shaped
// configs) from a Hugging Face directory or a config.json, trained on token files by the
// trainers' loop (examples/trainer), exported back as a Hugging Face directory. Every decoder
// layer is a fully_shard unit, sharded as it is built; then the root. See README.md beside
// this file.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "base_model.h"
#include "fsdp/data/token_file.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/llama_generate.h"
#include "fsdp/models/llama_lora.h"
#include "fsdp/models/llama_plan.h"
#include "llama_options.h"
#include "loop.h"
#include "move_unsharded.h"
#include "text_prompt.h"
#include "trainer_plan.h"

namespace {

namespace ll = fsdp::models::llama;
using llama::Options;

// A token file as the loop's data: the global batch of each step, and validation windows.
class TokenData final : public trainer::Dataset, public trainer::Windows {
 public:
  TokenData(const std::string& path, const Options& o, int64_t vocab,
            const std::string& loss_mask = "")
      : file_(path, fsdp::data::TokenFileOptions{fsdp::data::parse_token_dtype(o.tokens_dtype),
                                                 vocab, o.train.seq, o.train.seed,
                                                 /*scan_at_open=*/true, loss_mask}),
        mask_(loss_mask) {}
  trainer::Batch slice(int step, int64_t first, int64_t count) const override {
    auto b = file_.batch(step, first, count);
    return {b.inputs, b.targets};
  }
  int64_t count() const override { return file_.val_window_count(); }
  trainer::Batch windows(int64_t first, int64_t n) const override {
    auto b = file_.val_batch(first, n);
    return {b.inputs, b.targets};
  }
  std::string describe() const override {
    return fmt::format("{} ({} tokens{})", file_.path(), file_.size(),
                       mask_.empty() ? "" : ", loss mask " + mask_);
  }

 private:
  fsdp::data::TokenFile file_;
  std::string mask_;
};

fsdp::FullyShardOptions unit_options(const Options& o, bool layer) {
  fsdp::FullyShardOptions opts;
  if (o.train.dtype == "bf16") {
    opts.mp_policy.param_dtype = torch::kBFloat16;
    opts.mp_policy.reduce_dtype = torch::kFloat;
  }
  if (o.train.offload == "all") opts.offload_policy = fsdp::CPUOffloadPolicy{};
  if (layer) {
    opts.reshard_after_forward = o.train.reshard_after_forward;
    opts.activation_checkpointing = o.train.activation_checkpointing;
  }
  return opts;
}

struct Built {
  ll::Config config;
  ll::LlamaForCausalLM model{nullptr};
  fsdp::Unit<ll::LlamaForCausalLM> root;
};

// Each layer is sharded as soon as it is built, then the root, so a rank never holds the whole
// model: from a Hugging Face directory each rank then reads only its rows of every tensor.
Built build(const Options& o, const fsdp::Distributed& dist, const fsdp::DeviceMesh& mesh) {
  Built b;
  const auto layer_options = unit_options(o, /*layer=*/true);
  auto shard_layer = [&](int64_t, fsdp::Unit<ll::DecoderLayer>& layer) {
    layer->to(dist.device);
    fsdp::fully_shard(layer, mesh, layer_options);
    if (o.float8_all_gather) ll::use_float8_all_gather(layer);
  };
  auto shard_root = [&](ll::LlamaForCausalLM& model) {
    if (o.train.init_full_model) {
      model->to(dist.device);
      for (auto& layer : model->model->layers) shard_layer(0, layer);
    }
    // The root's own parameters (not the blocks' shards: host memory under --offload all).
    trainer::move_unsharded(*model, dist.device);
    b.root = fsdp::fully_shard(model, mesh, unit_options(o, /*layer=*/false));
  };
  // LoRA's adapters are drawn as they are built, from a Hugging Face directory too.
  torch::manual_seed(o.train.seed);
  if (!o.hf_dir.empty()) {
    ll::HfLoadOptions load;
    load.lora = o.lora;
    load.float8 = o.float8;
    load.tp = mesh.tp;
    load.sequence_parallel = o.train.sp;
    if (!o.train.init_full_model) load.on_layer_built = shard_layer;
    load.on_model_built = shard_root;
    auto hf = ll::load_hf_model(o.hf_dir, dist.group, load);
    b.config = hf.config;
    b.model = hf.model;
  } else {
    b.config = llama::model_config(o);
    ll::BuildOptions options;
    options.lora = o.lora;
    options.float8 = o.float8;
    options.tp = mesh.tp;
    options.sequence_parallel = o.train.sp;
    if (!o.train.init_full_model) options.on_layer_built = shard_layer;
    b.model = ll::build_llama(b.config, options);
    shard_root(b.model);
  }
  if (!o.lora_adapter.empty()) ll::load_peft_adapter(o.lora_adapter, *b.model, o.lora, dist.group);
  if (o.document_start) b.model->model->set_document_start(*o.document_start);
  return b;
}

// Which Linears compute in float8, so that a user sees what --float8 converted.
std::string float8_summary(const Options& o) {
  const auto& f = o.float8;
  if (!f.enabled) return "";
  return fmt::format("; float8 Linears (tensorwise){}{};",
                     f.skip.empty() ? "" : fmt::format(" but {}", fmt::join(f.skip, ",")),
                     o.float8_all_gather ? ", gathered in float8" : "");
}

// A rotary scaling as a model card states it, so that a user sees it was read (nothing for
// the default).
std::string rope_summary(const ll::Config& c) {
  const auto& r = c.rope_scaling;
  if (r.type == "linear") return fmt::format(" rope linear x{:g},", r.factor);
  if (r.type == "llama3") {
    return fmt::format(" rope llama3 x{:g} (original context {}),", r.factor,
                       r.original_max_position_embeddings);
  }
  return "";
}

// What LoRA trains, for the run's header.
std::string lora_summary(const Options& o, const ll::Config& config) {
  if (!o.lora.enabled()) return "";
  const int64_t trainable = ll::lora_parameter_count(config, o.lora);
  return fmt::format(
      "; LoRA rank {} alpha {:g} dropout {:g} on {}: {} trainable parameters ({:.3f}% of {}){}",
      o.lora.rank, o.lora.alpha, o.lora.dropout, fmt::join(o.lora.targets, ","), trainable,
      100.0 * static_cast<double>(trainable) / static_cast<double>(ll::parameter_count(config)),
      ll::parameter_count(config), o.lora_adapter.empty() ? ";" : ", from " + o.lora_adapter + ";");
}

trainer::PlanModel plan_model(const Options& o, const ll::Config& config) {
  trainer::PlanModel m;
  m.describe =
      fmt::format("Llama hidden {} layers {} heads {} kv heads {} intermediate {} vocab {}",
                  config.hidden_size, config.num_hidden_layers, config.num_attention_heads,
                  config.num_key_value_heads, config.intermediate_size, config.vocab_size);
  m.units = [&o, config](int64_t sequences, int compute_bytes, bool checkpointed, int tp) {
    ll::PlanShape shape;
    shape.model = config;
    shape.seq = o.train.seq;
    shape.batch_per_rank = sequences;
    shape.compute_bytes = compute_bytes;
    shape.activation_checkpointing = checkpointed;
    shape.tp = tp;
    return ll::plan_units(shape);
  };
  m.transient_bytes = [config](int64_t tokens, int tp) {
    // Loss parallel: each rank's gradients of its chunk of the vocabulary.
    ll::Config local = config;
    local.vocab_size = fsdp::tp::chunk_of(config.vocab_size, tp, 0).length;
    return ll::loss_transient_bytes(local, tokens);
  };
  return m;
}

// --dump-logits: the logits of the first --count validation windows (every rank runs the
// forward, rank 0 writes).
void dump_logits(const Options& o, Built& b, const TokenData& val, const fsdp::Distributed& dist) {
  torch::NoGradGuard no_grad;
  const int64_t n = std::min<int64_t>(o.count, val.count());
  auto logits = b.model->full_logits(b.root(val.windows(0, n).tokens.to(dist.device)))
                    .to(torch::kFloat)
                    .cpu();
  if (dist.group->rank() == 0) {
    fsdp::write_safetensors(o.dump_logits, {{"logits", logits.contiguous()}});
    fmt::print("wrote the logits of {} windows to {}\n", n, o.dump_logits);
  }
}

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

// --generate-ids: every rank generates (the units gather as in training); rank 0 prints.
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
    auto text = llama::encode_text_prompt(o);
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

int run(const Options& o, const fsdp::LaunchInfo& launch) {
  torch::set_num_threads(trainer::threads_for(o.train.threads));
  fsdp::InitOptions init;
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.train.comm_timeout_s * 1000));
  auto dist = fsdp::init_from_launch(launch, init);
  const auto mesh = fsdp::make_device_mesh(dist.group, o.train.replicas, o.train.tp);
  auto b = build(o, dist, mesh);
  const int64_t vocab = b.config.vocab_size;
  std::unique_ptr<TokenData> train, val;
  if (!o.data_tokens.empty()) {
    train = std::make_unique<TokenData>(o.data_tokens, o, vocab, o.loss_mask);
  }
  if (!o.val_tokens.empty()) {
    val = std::make_unique<TokenData>(o.val_tokens, o, vocab, o.val_loss_mask);
  }
  if (!o.dump_logits.empty()) {
    dump_logits(o, b, *val, dist);
    return 0;
  }
  if (!o.generate_ids.empty() || !o.generate_text.empty()) return generate(o, b, dist);
  trainer::Task task;
  task.root = b.root;
  task.module = b.model.ptr().get();
  task.logits = [&b](const torch::Tensor& tokens) { return b.root(tokens); };
  if (o.train.fused_loss) {
    // Through the root unit, which gathers its parameters around the call as forward does.
    task.fused_loss = [&b, chunk = o.train.loss_chunk](const torch::Tensor& tokens,
                                                       const torch::Tensor& targets) {
      return b.root.call(&ll::LlamaForCausalLMImpl::fused_loss, tokens, targets, chunk);
    };
  }
  task.vocab = vocab;
  if (mesh.tp) {
    // Loss parallel: the logits stay split over the vocabulary.
    task.loss = [&b](const torch::Tensor& logits, const torch::Tensor& targets) {
      return b.model->loss(logits, targets);
    };
    task.tp = ll::tp_layout(b.config, mesh.tp, mesh.dp_group());
  }
  // LoRA: checkpoints hold the adapters and their optimizer state; the frozen weights are
  // --hf-dir's (or --seed's), built again on resume: the checkpoints record which (base_model.h).
  if (o.lora.rank > 0 || !o.lora_adapter.empty()) {
    task.checkpoint_filter = fsdp::models::is_lora_parameter;
    const auto base = base_model(o);
    task.checkpoint_identity = {"base model", base.fingerprint, base.what};
  }
  task.train = train.get();
  task.masked_targets = !o.loss_mask.empty();
  task.validation = val.get();
  task.info = {
      "Llama",
      fmt::format("vocab {} hidden {} layers {} heads {} kv heads {} intermediate {}{}{}", vocab,
                  b.config.hidden_size, b.config.num_hidden_layers, b.config.num_attention_heads,
                  b.config.num_key_value_heads, b.config.intermediate_size,
                  b.config.tie_word_embeddings ? " tied" : "", rope_summary(b.config)) +
          lora_summary(o, b.config) + float8_summary(o),
      ll::parameter_count(b.config), ll::train_flops_per_token(b.config, o.train.seq)};
  task.finish = [&] {
    if (!o.export_adapter.empty()) {
      ll::PeftSaveOptions adapter;
      adapter.base_model = o.hf_dir;
      ll::save_peft_adapter(o.export_adapter, *b.model, o.lora, dist.group, adapter);
      if (dist.group->rank() == 0) fmt::print("exported the adapters to {}\n", o.export_adapter);
    }
    if (o.export_hf.empty()) return;
    ll::HfSaveOptions save;
    save.dtype = o.export_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
    save.max_shard_bytes = o.max_shard_bytes;
    save.tokenizer_files = o.tokenizer;
    save.tp = mesh.tp;
    ll::save_hf_checkpoint(o.export_hf, *b.model, b.config, dist.group, save);
    if (dist.group->rank() == 0) fmt::print("exported {}\n", o.export_hf);
  };
  return trainer::run_training(o.train, task, dist, mesh);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, llama::parse_options),
      [&] {
        try {
          const auto config = llama::model_config(options);
          return trainer::run_plan(options.train, plan_model(options, config));
        } catch (const std::exception& e) {
          fmt::print(stderr, "error: plan: {}\n", e.what());
          return 1;
        }
      },
      [&](const fsdp::LaunchInfo& launch) { return run(options, launch); });
}
