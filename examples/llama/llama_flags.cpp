#include "llama_flags.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>
#include <string_view>

#include "choice_flag.h"
#include "flag_checks.h"
#include "fsdp/data/token_file.h"
#include "fsdp/io/files.h"
#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_lora.h"
#include "output_paths.h"
#include "text_prompt.h"

namespace llama {
namespace {

namespace ll = fsdp::models::llama;

bool is_file(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string config_path(const Options& o) {
  return o.config.empty() ? o.hf_dir + "/config.json" : o.config;
}

// A mask file beside the token file it masks.
std::string check_mask(const std::string& mask, const char* flag, const std::string& tokens,
                       const char* tokens_flag, bool read_files, const char* expected) {
  if (mask.empty()) return "";
  if (tokens.empty()) return fmt::format("{} needs {} (the tokens it masks)", flag, tokens_flag);
  if (read_files && !is_file(mask)) {
    return fmt::format("{} {}: no such file (expected {})", flag, mask, expected);
  }
  return "";
}

}  // namespace

void add_model_flags(CLI::App& app, Options& o) {
  trainer::add_section(app, "model", [&] {
    app.add_option("--hf-dir", o.hf_dir,
                   "A Hugging Face directory (config.json, model.safetensors or shards with "
                   "model.safetensors.index.json): start from its weights");
    app.add_option("--config", o.config, "A config.json alone: start from random weights (--seed)");
    app.add_option("--preset", o.preset,
                   fmt::format("A published configuration ({}; Meta's config.json values, no "
                               "weights): random weights, or what a plan needs",
                               fmt::join(ll::preset_names(), ", ")));
  });
}

void prefer_command_line_model(Options& o, int argc, char** argv) {
  auto given = [&](std::string_view flag) {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == flag || (arg.size() > flag.size() && arg.substr(0, flag.size()) == flag &&
                          arg[flag.size()] == '=')) {
        return true;
      }
    }
    return false;
  };
  const bool hf_dir = given("--hf-dir"), config = given("--config"), preset = given("--preset");
  if (!hf_dir && !config && !preset) return;
  if (!hf_dir) o.hf_dir.clear();
  if (!config) o.config.clear();
  if (!preset) o.preset.clear();
}

std::string check_model(const Options& o) {
  const int sources = !o.hf_dir.empty() + !o.config.empty() + !o.preset.empty();
  if (sources != 1) {
    return "give the model as --hf-dir DIR (a Hugging Face directory), --config FILE (a "
           "config.json, random weights from --seed) or --preset NAME, one of the three";
  }
  if (!o.preset.empty() && !ll::preset_config(o.preset)) {
    return fmt::format("--preset {}: unknown; expected one of {}", o.preset,
                       fmt::join(ll::preset_names(), ", "));
  }
  if (o.preset.empty() && !is_file(config_path(o))) {
    return fmt::format("{}: no such file (expected a Hugging Face config.json)", config_path(o));
  }
  return "";
}

fsdp::models::llama::Config model_config(const Options& o) {
  if (!o.preset.empty()) return *ll::preset_config(o.preset);
  return ll::read_hf_config(config_path(o));
}

void add_data_flags(CLI::App& app, Options& o, std::optional<int64_t>& batch) {
  trainer::add_section(app, "data", [&] {
    app.add_option("--data-tokens", o.data_tokens,
                   "Training tokens: little-endian token ids, one after another "
                   "(scripts/tokenize_text.py writes them)");
    app.add_option("--val-tokens", o.val_tokens,
                   "Validation tokens: the loss over windows of --seq + 1 tokens");
    app.add_option("--tokens-dtype", o.tokens_dtype,
                   "uint16, or uint32 for vocabularies above 65536")
        ->check(CLI::IsMember({"uint16", "uint32"}));
    app.add_option("--seq", o.train.seq, "Tokens per sequence")->check(trainer::positive());
    app.add_option("--batch", batch,
                   "Global batch in sequences, split evenly over ranks (default: 8 per rank)")
        ->check(trainer::positive());
    app.add_option(
        "--loss-mask", o.loss_mask,
        "One byte per token of --data-tokens (scripts/tokenize_chat.py writes it): 1 where "
        "the token counts as a target, 0 where not (a chat's prompts); the training loss "
        "is the mean over counted targets (transformers' labels of -100)");
    app.add_option("--document-start-id", o.document_start,
                   "Packing: every occurrence of this token id (a chat template's begin-of-text, "
                   "which tokenize_chat.py prints) starts a document: positions restart at 0 and "
                   "attention stays inside each document, in training and validation windows "
                   "(transformers' position_ids with a block-diagonal causal mask). Without it "
                   "a window's tokens all attend to the ones before them");
  });
  trainer::add_section(app, "optimizer", [&] {
    app.add_option("--steps", o.train.steps, "Training steps")->check(trainer::positive());
  });
  trainer::add_section(app, "validation", [&] {
    app.add_option("--val-loss-mask", o.val_loss_mask,
                   "One byte per token of --val-tokens: the validation loss is the mean over the "
                   "targets whose byte is 1 (scripts/tokenize_chat.py on held-out conversations)");
  });
}

std::string check_data(const Options& o, bool read_files) {
  for (const auto& [flag, path] :
       {std::pair{"--data-tokens", o.data_tokens}, std::pair{"--val-tokens", o.val_tokens}}) {
    if (read_files && !path.empty() && !is_file(path)) {
      return fmt::format("{} {}: no such file (expected a file of {} token ids)", flag, path,
                         o.tokens_dtype);
    }
  }
  for (auto err :
       {check_mask(o.val_loss_mask, "--val-loss-mask", o.val_tokens, "--val-tokens", read_files,
                   "one byte per token of --val-tokens"),
        check_mask(o.loss_mask, "--loss-mask", o.data_tokens, "--data-tokens", read_files,
                   "one byte per token of --data-tokens, from scripts/tokenize_chat.py")}) {
    if (!err.empty()) return err;
  }
  // The checks a token file's size allows (whole tokens, not empty, one sequence at least, a
  // mask of one byte per token), before the model is built: minutes for a large one. The ids
  // against the vocabulary are scanned when the data is read.
  const auto dtype = fsdp::data::parse_token_dtype(o.tokens_dtype);
  for (const auto& [path, mask] :
       {std::pair{o.data_tokens, o.loss_mask}, std::pair{o.val_tokens, o.val_loss_mask}}) {
    if (!read_files || path.empty()) continue;
    try {
      fsdp::data::TokenFileOptions options;
      options.dtype = dtype;
      options.vocab = dtype == fsdp::data::TokenDtype::kUInt16 ? 65536 : int64_t{1} << 32;
      options.seq = o.train.seq;
      options.scan_at_open = false;
      options.loss_mask = mask;
      fsdp::data::TokenFile probe(path, options);
    } catch (const std::exception& e) {
      return e.what();
    }
  }
  if (o.document_start) {
    const int64_t vocab = model_config(o).vocab_size;
    if (*o.document_start < 0 || *o.document_start >= vocab) {
      return fmt::format("--document-start-id {} is not a token id of the model (0 to {})",
                         *o.document_start, vocab - 1);
    }
  }
  return "";
}

void add_export_flags(CLI::App& app, Options& o) {
  trainer::add_section(app, "checkpoint", [&] {
    app.add_option("--export-hf", o.export_hf,
                   "After training, write the model as a Hugging Face directory (a new one)");
    trainer::add_choice(app, "--export-dtype", o.export_dtype, "fp32 or bf16");
    app.add_option(
        "--tokenizer", o.tokenizer,
        "Tokenizer files, or a directory holding them, copied into --export-hf (llama.cpp "
        "needs tokenizer.model)");
    app.add_option("--max-shard-bytes", o.max_shard_bytes,
                   "--export-hf splits the weights into files of at most this many bytes")
        ->check(trainer::positive());
    app.add_option("--export-adapter", o.export_adapter,
                   "LoRA: after training, write the adapters as a PEFT adapter directory (a new "
                   "one; PeftModel.from_pretrained loads it onto the --hf-dir model); --export-hf "
                   "then writes the model with the adapters merged");
  });
}

std::string check_export(const Options& o, bool read_files) {
  // Refused before training: a directory a user saved is never overwritten.
  if (!o.export_hf.empty() && exists(o.export_hf)) {
    return fmt::format("--export-hf {}: exists already; give a new directory", o.export_hf);
  }
  if (read_files && !o.export_hf.empty()) {
    if (auto err = trainer::check_new_directory("--export-hf", o.export_hf); !err.empty()) {
      return err;
    }
  }
  for (const auto& t : o.tokenizer) {
    if (read_files && !exists(t))
      return fmt::format("--tokenizer {}: no such file or directory", t);
    // A directory: the export copies the tokenizer files it holds, and needs one at least.
    if (read_files && fsdp::io::is_directory(t)) {
      const auto& names = ll::tokenizer_file_names();
      if (std::none_of(names.begin(), names.end(),
                       [&](const std::string& n) { return exists(t + "/" + n); })) {
        return fmt::format("--tokenizer {}: the directory holds none of {}", t,
                           fmt::join(names, ", "));
      }
    }
  }
  if (!o.export_adapter.empty()) {
    if (!o.lora.enabled()) return "--export-adapter needs LoRA adapters (--lora-rank R)";
    if (exists(o.export_adapter)) {
      return fmt::format("--export-adapter {}: exists already; give a new directory",
                         o.export_adapter);
    }
    if (fsdp::io::without_trailing_slash(o.export_adapter) ==
        fsdp::io::without_trailing_slash(o.export_hf)) {
      return fmt::format("--export-adapter and --export-hf are both {}: give two directories",
                         o.export_adapter);
    }
    if (read_files) {
      if (auto err = trainer::check_new_directory("--export-adapter", o.export_adapter);
          !err.empty()) {
        return err;
      }
    }
  }
  return "";
}

void add_logits_flags(CLI::App& app, Options& o) {
  trainer::add_section(app, "validation", [&] {
    app.add_option("--dump-logits", o.dump_logits,
                   "Deprecated (a test aid). With --eval-only: write the "
                   "logits of the first --count validation windows to this safetensors file "
                   "(tensor \"logits\", fp32)");
    app.add_option("--count", o.count, "Windows --dump-logits writes")->check(trainer::positive());
  });
}

void add_lora_flags(CLI::App& app, Options& o, GivenFlags& given, bool adapter_only) {
  trainer::add_section(app, "lora", [&] {
    app.add_option("--lora-adapter", o.lora_adapter,
                   "LoRA: start from the adapters of this PEFT adapter directory (its rank, alpha, "
                   "dropout and targets, unless given)");
    if (adapter_only) return;
    given.lora_rank =
        app.add_option("--lora-rank", o.lora.rank,
                       "LoRA: train low-rank adapters of this rank on --lora-targets, "
                       "every other parameter frozen (PEFT's LoraConfig r; 0: full "
                       "fine-tuning)")
            ->check(trainer::non_negative(" (0: full fine-tuning)"));
    given.lora_alpha = app.add_option("--lora-alpha", o.lora.alpha,
                                      "LoRA: the adapters' update is scaled by alpha / rank");
    given.lora_dropout = app.add_option("--lora-dropout", o.lora.dropout,
                                        "LoRA: dropout on the adapters' input while training");
    given.lora_targets =
        app.add_option("--lora-targets", o.lora.targets,
                       fmt::format("LoRA: the Linears of every layer to adapt, comma-separated, "
                                   "some of {}",
                                   fmt::join(fsdp::models::lora_target_names(), ",")))
            ->delimiter(',');
  });
}

std::string read_lora_adapter(Options& o, const GivenFlags& given) {
  if (o.lora_adapter.empty()) return "";
  auto count = [](const CLI::Option* flag) { return flag != nullptr && flag->count() > 0; };
  try {
    const auto found = ll::read_peft_adapter_config(o.lora_adapter);
    if ((count(given.lora_rank) && o.lora.rank != found.rank) ||
        (count(given.lora_alpha) && o.lora.alpha != found.alpha) ||
        (count(given.lora_targets) &&
         std::set<std::string>(o.lora.targets.begin(), o.lora.targets.end()) !=
             std::set<std::string>(found.targets.begin(), found.targets.end()))) {
      return fmt::format(
          "--lora-adapter {} holds rank {} alpha {:g} on {}; the flags say rank {} alpha {:g} "
          "on {} (drop them, or give the same)",
          o.lora_adapter, found.rank, found.alpha, fmt::join(found.targets, ","), o.lora.rank,
          o.lora.alpha, fmt::join(o.lora.targets, ","));
    }
    const double keep_dropout = o.lora.dropout;
    o.lora = found;
    if (count(given.lora_dropout)) o.lora.dropout = keep_dropout;
  } catch (const std::exception& e) {
    return fmt::format("--lora-adapter: {}", e.what());
  }
  return "";
}

void add_float8_flags(CLI::App& app, Options& o) {
  trainer::add_section(app, "float8", [&] {
    app.add_flag("--float8", o.float8.enabled,
                 "float8 training: the decoder layers' Linears run their GEMMs in float8 "
                 "(torchao's Float8Linear recipe 'tensorwise': e4m3 activations and weights, e5m2 "
                 "gradients, dynamic scales); master weights, gradients and optimizer state as "
                 "without; the head stays. On the CPU, or a GPU of compute capability 8.9 or "
                 "newer (rowwise: 8.9, 9.x, 10.x)");
    app.add_option(
           "--float8-skip", o.float8.skip,
           "With --float8: Linears kept out of it, by name (q_proj, k_proj, v_proj, o_proj, "
           "gate_proj, up_proj, down_proj)")
        ->delimiter(',');
    trainer::add_choice(app, "--float8-recipe", o.float8.scaling,
                        "With --float8: torchao's recipe: tensorwise (one scale per tensor, the "
                        "gradients in e5m2), or rowwise (a power-of-2 scale per row of each GEMM "
                        "operand, all in e4m3: more accurate where tokens differ in magnitude; "
                        "not with --float8-all-gather)");
    app.add_flag("--float8-all-gather", o.float8_all_gather,
                 "With --float8: FSDP gathers those Linears' weights in float8 (torchao's "
                 "enable_fsdp_float8_all_gather): half of bf16's bytes for them, the same numbers "
                 "(at world 1, where nothing is gathered otherwise, it only adds work)");
  });
}

void add_tp_flags(CLI::App& app, Options& o, bool with_sp) {
  trainer::add_section(app, "parallelism", [&] {
    app.add_option("--tp", o.train.tp,
                   "Tensor parallelism: groups of this many consecutive ranks split every layer's "
                   "matmuls (heads, MLP and vocabulary; Megatron's layout), and fully_shard shards "
                   "each rank's slices over the world / tp data-parallel ranks");
    if (!with_sp) return;
    app.add_flag("--sp", o.train.sp,
                 "Sequence parallelism with --tp: norms and residuals on chunks of the sequence "
                 "(all-gather before and reduce-scatter after the split matmuls instead of "
                 "all-reduces); --seq must divide by --tp");
  });
}

namespace {

std::string check_lora(const Options& o) {
  if (o.lora.enabled()) {
    try {
      ll::validate_lora(model_config(o), o.lora, o.train.tp);
    } catch (const std::exception& e) {
      return fmt::format("--lora-rank {} --lora-targets {}: {}", o.lora.rank,
                         fmt::join(o.lora.targets, ","), e.what());
    }
  }
  const auto& targets = o.lora.targets;
  if (o.train.fused_loss && o.lora.enabled() &&
      std::find(targets.begin(), targets.end(), "lm_head") != targets.end()) {
    return "--fused-loss fuses a plain head: not with a LoRA adapter on lm_head";
  }
  return "";
}

std::string check_float8(const Options& o) {
  const bool rowwise = o.float8.scaling == fsdp::ops::Float8Scaling::rowwise;
  if (!o.float8.enabled && o.float8.skip.empty() && !o.float8_all_gather && !rowwise) return "";
  if (!o.float8.enabled) {
    return o.float8_all_gather ? "--float8-all-gather needs --float8"
           : rowwise           ? "--float8-recipe needs --float8"
                               : "--float8-skip needs --float8";
  }
  if (rowwise && o.float8_all_gather) {
    return "--float8-all-gather casts each weight with one scale: it needs --float8-recipe "
           "tensorwise, not rowwise";
  }
  if (o.float8_all_gather && o.train.quantize_all_gather > 0) {
    return "--float8-all-gather and --quantize-all-gather: give one (each is the layers' "
           "all-gather)";
  }
  try {
    ll::validate_float8(model_config(o), o.float8, o.train.tp, o.lora.enabled());
  } catch (const std::exception& e) {
    return fmt::format("--{}", e.what());  // "--float8: ...": validate_float8 says "float8: "
  }
  return "";
}

}  // namespace

std::string check_model_transforms(const Options& o) {
  for (auto err : {check_lora(o), check_float8(o)}) {
    if (!err.empty()) return err;
  }
  if (o.train.tp > 1) {
    // The heads must split evenly: refused here, before any rank starts communicating.
    try {
      ll::validate_tp(model_config(o), o.train.tp);
    } catch (const std::exception& e) {
      return fmt::format("--tp {}: {}", o.train.tp, e.what());
    }
  }
  return "";
}

void add_generation_flags(CLI::App& app, Options& o, GivenFlags& given) {
  trainer::add_section(app, "generation", [&] {
    app.add_option("--generate-ids", o.generate_ids,
                   "Generate after these prompt token ids (space or comma separated) with a cache "
                   "of keys and values, on every rank (sharded like training), and print the new "
                   "ids")
        ->delimiter(',');
    given.generate = app.add_option(
        "--generate", o.generate_text,
        "Generate after this text, encoded by --hf-dir's tokenizer.json (a byte-level BPE: "
        "fsdp/text/tokenizer.h), and print the new ids and their text (with --chat, the text is "
        "the user's message and the model's chat template is applied; without, give the rendered "
        "text)");
    app.add_flag("--chat", o.chat,
                 "--generate's text is the user's turn: --hf-dir's chat template "
                 "(chat_template.jinja or tokenizer_config.json's) renders it, after --system's "
                 "turn, with the assistant's turn opened, as transformers' apply_chat_template("
                 "add_generation_prompt=True) does");
    app.add_option("--system", o.system_prompt, "With --chat: a system turn before the user's");
    app.add_option("--max-new-tokens", o.max_new_tokens, "Tokens generation adds at most")
        ->check(trainer::non_negative());
    app.add_option("--temperature", o.temperature,
                   "0: greedy; otherwise sample at this temperature (with --top-k, --top-p, "
                   "--seed)")
        ->check(trainer::non_negative(" (0: greedy)"));
    app.add_option("--top-k", o.top_k, "Sample among the k most likely tokens (0: all)")
        ->check(trainer::non_negative());
    app.add_option("--top-p", o.top_p,
                   "Sample among the most likely tokens whose probabilities sum to p (1: all)")
        ->check(trainer::in_open_closed(0, 1));
    app.add_flag("--ignore-eos", o.ignore_eos,
                 "Go on past the end-of-sequence ids (by default generation stops after one, as "
                 "transformers' generate: generation_config.json's, else config.json's)");
    app.add_flag("--no-cache", o.no_cache,
                 "Generate without the cache: the whole sequence in every forward");
  });
}

bool generating(const Options& o) {
  return !o.generate_ids.empty() || !o.generate_text.empty() || o.chat || !o.system_prompt.empty();
}

namespace {

std::string check_prompt(const Options& o, const GivenFlags& given) {
  if (given.generate != nullptr && given.generate->count() > 0 && o.generate_text.empty()) {
    return "--generate needs a text (an empty prompt generates nothing)";
  }
  if (!o.generate_text.empty()) {
    if (!o.generate_ids.empty()) return "--generate TEXT and --generate-ids IDS: give one";
    if (!have_tokenizer()) return check_text_prompt(o);  // names the missing library
    if (o.hf_dir.empty() || !is_file(o.hf_dir + "/tokenizer.json")) {
      return fmt::format(
          "--generate needs the model's tokenizer.json in --hf-dir ({} has none; a model with "
          "only a SentencePiece tokenizer.model takes --generate-ids)",
          o.hf_dir.empty() ? "no --hf-dir given" : o.hf_dir);
    }
  }
  if (o.chat && o.generate_text.empty()) {
    return "--chat needs --generate TEXT: the user's message, put through the chat template";
  }
  if (!o.system_prompt.empty() && !o.chat) return "--system needs --chat";
  return check_text_prompt(o);
}

}  // namespace

std::string check_generation(const Options& o, const GivenFlags& given) {
  if (auto error = check_prompt(o, given); !error.empty()) return error;
  if (o.train.sp) return "--generate-ids and --sp: one new token does not split over --tp";
  return "";
}

}  // namespace llama
