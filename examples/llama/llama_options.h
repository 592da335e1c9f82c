// Command-line options of train_llama: where the model comes from (a Hugging Face directory or
// a config.json for a random start), the token files, the exports, and the training loop's
// flags (trainer/train_options.h).
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
  std::string export_dtype = "fp32";
  std::vector<std::string> tokenizer;  // tokenizer files (or a directory) copied into it
  int64_t max_shard_bytes = 5'000'000'000;
  std::string dump_logits;  // with --eval-only: the logits of the first --count windows
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

struct ParseResult {
  std::optional<Options> options;
  int exit_code = 0;
  std::string message;
};

// Parses argv and checks what can be checked before any communication: the flags' values, that
// the files named exist, and their combinations. `world` splits the global batch.
ParseResult parse_options(int argc, char** argv, int world);

// The model's configuration the flags name: --hf-dir's config.json, --config, or --preset.
// InvalidArgument when the file cannot be read.
fsdp::models::llama::Config model_config(const Options& o);

}  // namespace llama
