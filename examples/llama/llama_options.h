// Command-line options of the Llama programs: train_llama (training and evaluation),
// llama_generate (generation and chat) and fsdp_plan (the planner for a train_llama run). One
// Options holds them all; each program registers the sections it has (llama_flags.h and the
// loop's trainer/train_options.h) and checks them, the rules across sections included.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "fsdp/models/float8_options.h"
#include "fsdp/models/llama_config.h"
#include "fsdp/models/lora_options.h"
#include "train_options.h"

namespace llama {

struct Options {
  std::string hf_dir;         // config.json + safetensors: start from these weights
  std::string config;         // a config.json alone: random weights from --seed
  std::string preset;         // a published configuration by name: random weights, or a plan
  std::string data_tokens;    // training tokens (uint16 or uint32, nanoGPT's raw format)
  std::string val_tokens;     // validation tokens
  std::string loss_mask;      // one byte per training token: 1 counts as a target
  std::string val_loss_mask;  // the same for --val-tokens
  std::string tokens_dtype = "uint16";
  // Packing: positions restart and attention stays within each document at this token id.
  std::optional<int64_t> document_start;
  std::string export_hf;  // after training, a Hugging Face directory of the model
  trainer::Dtype export_dtype = trainer::Dtype::fp32;
  std::vector<std::string> tokenizer;  // tokenizer files (or a directory) copied into it
  int64_t max_shard_bytes = 5'000'000'000;
  std::string dump_logits;  // deprecated: with --eval-only, the logits of the first --count windows
  int64_t count = 1;
  // --generate-ids: generate after these prompt tokens instead of training (llama_generate.h).
  std::vector<int64_t> generate_ids;
  // --generate: the same after this text, encoded by --hf-dir's tokenizer.json (and the new
  // tokens decoded).
  std::string generate_text;
  // --chat: --generate's text is the user's turn, put through --hf-dir's chat template
  // (fsdp/text/chat_template.h; text_prompt.h) after an optional system turn.
  bool chat = false;
  std::string system_prompt;
  int64_t max_new_tokens = 32;
  double temperature = 0;  // 0: greedy
  int64_t top_k = 0;
  double top_p = 1.0;
  bool no_cache = false;
  bool ignore_eos = false;
  // LoRA: adapters on these Linears, every other parameter frozen (fsdp/models/llama_lora.h).
  fsdp::models::LoraOptions lora;  // rank 0: full fine-tuning
  std::string lora_adapter;        // a PEFT adapter directory: the adapters to start from
  std::string export_adapter;      // after training, PEFT's adapter directory of the adapters
  // float8 GEMMs in the decoder's Linears but those skipped (fsdp/models/float8_options.h).
  fsdp::models::Float8Options float8;
  // Their weights gathered in float8 (llama::use_float8_all_gather).
  bool float8_all_gather = false;
  trainer::TrainOptions train;
};

// What a parse decided: run with `options`, or exit with `exit_code` after printing
// `message` (--help's text, or the error naming the flag and what is expected). `notice`:
// deprecation lines rank 0 prints on stderr before it runs.
struct ParseResult {
  std::optional<Options> options;
  int exit_code = 0;
  std::string message;
  std::string notice;
};

// train_llama: parses argv and checks what can be checked before any communication: the
// flags' values, that the files named exist, and their combinations. `world` splits the global
// batch. The deprecated ways to generate (--generate-ids, --generate, --chat), plan (--plan) and
// dump logits (--dump-logits) still parse, with a notice naming their new program.
ParseResult parse_options(int argc, char** argv, int world);

// llama_generate: the model, a PEFT adapter, --tp, the prompt and the sampling, and the job's
// flags (--seed, --dtype, --threads, --comm-timeout).
ParseResult parse_generate_options(int argc, char** argv, int world);

// fsdp_plan: train_llama's training flags (or recipe) without --plan, planned at --plan-world
// ranks (default: the launched world); the files they name need not exist here.
ParseResult parse_plan_options(int argc, char** argv, int world);

// The model's configuration the flags name: --hf-dir's config.json, --config, or --preset.
// InvalidArgument when the file cannot be read.
fsdp::models::llama::Config model_config(const Options& o);

}  // namespace llama
