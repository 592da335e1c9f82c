#include "llama_build.h"

#include <fmt/format.h>

#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama_lora.h"
#include "fsdp/models/llama_plan.h"
#include "loop.h"
#include "move_unsharded.h"
#include "shard_options.h"

namespace llama {

namespace ll = fsdp::models::llama;

// Each layer is sharded as soon as it is built, then the root, so a rank never holds the whole
// model: from a Hugging Face directory each rank then reads only its rows of every tensor.
Built build(const Options& o, const fsdp::Distributed& dist, const fsdp::DeviceMesh& mesh) {
  trainer::check_float8_device(o.float8.enabled, o.float8.scaling, dist);
  Built b;
  const auto layer_options = trainer::shard_options(o.train, /*block=*/true);
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
    b.root = fsdp::fully_shard(model, mesh, trainer::shard_options(o.train, /*block=*/false));
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
    b.config = model_config(o);
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

int plan(const Options& o) {
  try {
    return trainer::run_plan(o.train, plan_model(o, model_config(o)));
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: plan: {}\n", e.what());
    return 1;
  }
}

}  // namespace llama
