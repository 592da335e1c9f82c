// The Llama model the flags describe, built and sharded: every decoder layer a fully_shard unit
// as soon as it is built, then the root, so a rank never holds the whole model (from a Hugging
// Face directory each rank reads only its rows of every tensor). train_llama, llama_generate
// and the tests' llama_dump_logits build it so; fsdp_plan describes it to the planner.
#pragma once

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"
#include "llama_options.h"
#include "trainer_plan.h"

namespace llama {

struct Built {
  fsdp::models::llama::Config config;
  fsdp::models::llama::LlamaForCausalLM model{nullptr};
  fsdp::Unit<fsdp::models::llama::LlamaForCausalLM> root;
};

// From --hf-dir's weights (and --lora-adapter's), or random ones from --seed; LoRA, float8,
// tensor parallelism and packing as the options say. Collective over dist's group.
Built build(const Options& o, const fsdp::Distributed& dist, const fsdp::DeviceMesh& mesh);

// What the planner needs of this model at o.train.seq (trainer_plan.h).
trainer::PlanModel plan_model(const Options& o, const fsdp::models::llama::Config& config);

// Prints the plan of the run `o` describes (trainer::run_plan); returns the exit code: 0, or 1
// with the reason on stderr (a config.json that cannot be read, a layout the model cannot take,
// a plan that does not fit --plan-capacity-gib).
int plan(const Options& o);

}  // namespace llama
