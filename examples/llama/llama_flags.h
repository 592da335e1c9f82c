// train_llama's, llama_generate's and fsdp_plan's own flags, one function per section (the
// loop's are trainer/train_options.h's): each registers its section's flags in it
// (trainer::add_section) and checks their values. A program composes the sections it has
// (llama_options.cpp); the rules that span sections are there too.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "llama_options.h"
#include "sections.h"

namespace llama {

// The flags whose presence, not only their value, decides something after parsing.
struct GivenFlags {
  CLI::Option* lora_rank = nullptr;
  CLI::Option* lora_alpha = nullptr;
  CLI::Option* lora_dropout = nullptr;
  CLI::Option* lora_targets = nullptr;
  CLI::Option* generate = nullptr;
};

// [model]: --hf-dir, --config, --preset.
void add_model_flags(CLI::App& app, Options& o);
std::string check_model(const Options& o);
// After parsing: a model given on the command line (--hf-dir, --config or --preset) replaces a
// recipe's (a recipe naming --preset "llama3-70b" run with --hf-dir DIR: the weights of DIR).
void prefer_command_line_model(Options& o, int argc, char** argv);

// [data]: the token files and masks, --seq, --batch (`batch`: unset means 8 per data-parallel
// rank), --document-start-id; and [optimizer]'s --steps, [validation]'s --val-loss-mask.
// `read_files` false (planning) checks no file.
void add_data_flags(CLI::App& app, Options& o, std::optional<int64_t>& batch);
std::string check_data(const Options& o, bool read_files);

// [checkpoint]: --export-hf, --export-dtype, --tokenizer, --max-shard-bytes, --export-adapter.
void add_export_flags(CLI::App& app, Options& o);
std::string check_export(const Options& o, bool read_files);

// [validation]: --dump-logits and --count (deprecated: a test aid, logits.h).
void add_logits_flags(CLI::App& app, Options& o);

// [lora]: --lora-rank, --lora-alpha, --lora-dropout, --lora-targets, --lora-adapter; with
// `adapter_only`, --lora-adapter alone (generation: the adapters' shapes are the directory's).
void add_lora_flags(CLI::App& app, Options& o, GivenFlags& given, bool adapter_only = false);
// Reads --lora-adapter's configuration into o.lora; a flag given too must agree. The error or "".
std::string read_lora_adapter(Options& o, const GivenFlags& given);

// [float8]: --float8, --float8-skip, --float8-recipe, --float8-all-gather.
void add_float8_flags(CLI::App& app, Options& o);

// [parallelism]: --tp, and --sp with it when `with_sp`.
void add_tp_flags(CLI::App& app, Options& o, bool with_sp);

// LoRA, float8 and tensor parallelism against the model: the error or "".
std::string check_model_transforms(const Options& o);

// [generation]: the prompt (ids, or text with --chat and --system) and the sampling.
void add_generation_flags(CLI::App& app, Options& o, GivenFlags& given);
bool generating(const Options& o);
std::string check_generation(const Options& o, const GivenFlags& given);

}  // namespace llama
