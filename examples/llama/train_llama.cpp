// train_llama: a Llama-family model (fsdp::models::llama: Llama 2/3, Mistral- and Qwen2-shaped
// configs) from a Hugging Face directory or a config.json, trained or evaluated on token files
// by the trainers' loop (examples/trainer), exported back as a Hugging Face directory. Every
// decoder layer is a fully_shard unit, sharded as it is built (llama_build.h); then the root.
// Generation is llama_generate's and planning fsdp_plan's; their old flags here still work,
// deprecated. See README.md beside this file.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "base_model.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_lora.h"
#include "generation.h"
#include "llama_build.h"
#include "llama_flags.h"
#include "llama_options.h"
#include "logits.h"
#include "loop.h"
#include "token_data.h"

namespace {

namespace ll = fsdp::models::llama;
using llama::Built;
using llama::Options;
using llama::TokenData;

// Which Linears compute in float8, so that a user sees what --float8 converted.
std::string float8_summary(const Options& o) {
  const auto& f = o.float8;
  if (!f.enabled) return "";
  return fmt::format("; float8 Linears ({}){}{};", trainer::name(f.scaling),
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

// The model's part of the loop's task: its forward and loss (fused, or split over the
// vocabulary under --tp), what its checkpoints hold, and what the run's header says of it.
trainer::Task model_task(const Options& o, Built& b, const fsdp::DeviceMesh& mesh) {
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
  task.vocab = b.config.vocab_size;
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
    const auto base = llama::base_model(o);
    task.checkpoint_identity = {"base model", base.fingerprint, base.what};
  }
  const auto& c = b.config;
  task.info = {"Llama",
               fmt::format("vocab {} hidden {} layers {} heads {} kv heads {} intermediate {}{}{}",
                           c.vocab_size, c.hidden_size, c.num_hidden_layers, c.num_attention_heads,
                           c.num_key_value_heads, c.intermediate_size,
                           c.tie_word_embeddings ? " tied" : "", rope_summary(c)) +
                   lora_summary(o, c) + float8_summary(o),
               ll::parameter_count(c), ll::train_flops_per_token(c, o.train.seq)};
  return task;
}

// After training: --export-adapter's PEFT directory, --export-hf's Hugging Face one.
void export_model(const Options& o, Built& b, const fsdp::Distributed& dist,
                  const fsdp::DeviceMesh& mesh) {
  if (!o.export_adapter.empty()) {
    ll::PeftSaveOptions adapter;
    adapter.base_model = o.hf_dir;
    ll::save_peft_adapter(o.export_adapter, *b.model, o.lora, dist.group, adapter);
    if (dist.group->rank() == 0) fmt::print("exported the adapters to {}\n", o.export_adapter);
  }
  if (o.export_hf.empty()) return;
  ll::HfSaveOptions save;
  save.dtype = o.export_dtype == trainer::Dtype::bf16 ? torch::kBFloat16 : torch::kFloat;
  save.max_shard_bytes = o.max_shard_bytes;
  save.tokenizer_files = o.tokenizer;
  save.tp = mesh.tp;
  ll::save_hf_checkpoint(o.export_hf, *b.model, b.config, dist.group, save);
  if (dist.group->rank() == 0) fmt::print("exported {}\n", o.export_hf);
}

int run(const Options& o, const fsdp::LaunchInfo& launch) {
  auto dist = trainer::start_job(o.train, launch);
  const auto mesh = fsdp::make_device_mesh(dist.group, o.train.replicas, o.train.tp);
  auto b = llama::build(o, dist, mesh);
  const int64_t vocab = b.config.vocab_size;
  std::unique_ptr<TokenData> train, val;
  if (!o.data_tokens.empty()) {
    train = std::make_unique<TokenData>(o.data_tokens, o, vocab, o.loss_mask);
  }
  if (!o.val_tokens.empty()) {
    val = std::make_unique<TokenData>(o.val_tokens, o, vocab, o.val_loss_mask);
  }
  // The deprecated jobs (llama_options.h): the tests' llama_dump_logits, llama_generate.
  if (!o.dump_logits.empty()) {
    llama::write_logits(o.dump_logits, o.count, b, *val, dist);
    return 0;
  }
  if (llama::generating(o)) return llama::generate(o, b, dist);
  auto task = model_task(o, b, mesh);
  task.train = train.get();
  task.masked_targets = !o.loss_mask.empty();
  task.validation = val.get();
  task.finish = [&] { export_model(o, b, dist, mesh); };
  return trainer::run_training(o.train, task, dist, mesh);
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, llama::parse_options),
      [&] { return llama::plan(options); },
      [&](const fsdp::LaunchInfo& launch) { return run(options, launch); });
}
