#include "llama_options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <functional>
#include <initializer_list>

#include "llama_flags.h"

namespace llama {
namespace {

constexpr const char* kLaunch =
    "\nLaunch: mpirun -np N, torchrun --no-python --nproc-per-node N, or scripts/launch.sh "
    "--nproc N.";

ParseResult fail(const std::string& error) { return {std::nullopt, 2, "error: " + error, ""}; }

// The first error of `checks`, run in order: a later check may rely on an earlier one (the
// model's config.json is read only once it is known to exist).
std::string first_error(std::initializer_list<std::function<std::string()>> checks) {
  for (const auto& check : checks) {
    if (auto error = check(); !error.empty()) return error;
  }
  return "";
}

// The loop's flags with the usual choices for language models: AdamW betas (0.9, 0.95), weight
// decay 0.1, a cosine schedule.
trainer::TrainDefaults language_model_defaults() {
  trainer::TrainDefaults defaults;
  defaults.beta2 = 0.95;
  defaults.weight_decay = 0.1;
  defaults.lr_schedule = trainer::LrSchedule::cosine;
  return defaults;
}

// train_llama's and fsdp_plan's sections: everything but generation and the logit dump.
struct TrainingFlags {
  Options o;
  std::optional<int64_t> batch;
  std::string profile_steps;
  GivenFlags given;

  void add(CLI::App& app, bool with_plan_flag) {
    o.train.seq = 256;
    o.train.steps = 20;
    add_model_flags(app, o);
    add_data_flags(app, o, batch);
    add_tp_flags(app, o, /*with_sp=*/true);
    add_lora_flags(app, o, given);
    add_float8_flags(app, o);
    add_export_flags(app, o);
    trainer::add_train_flags(app, o.train, language_model_defaults(), profile_steps,
                             with_plan_flag);
  }

  // After parsing: the adapter's configuration, the world planned for, the default batch (8
  // sequences per data-parallel rank, the TP ranks of one sharing theirs).
  std::string finish(int& world) {
    if (auto error = read_lora_adapter(o, given); !error.empty()) return error;
    auto& t = o.train;
    if (t.plan && t.plan_world > 0) world = t.plan_world;
    t.plan_world = world;
    t.batch = batch.value_or(8 * (t.tp >= 1 && world % t.tp == 0 ? world / t.tp : world));
    return trainer::finish_train_options(t, profile_steps, world);
  }
};

// What train_llama runs: training, evaluation (--eval-only), or a deprecated job.
std::string check_training(const Options& o) {
  if (o.train.eval_only) {
    if (o.val_tokens.empty()) return "--eval-only needs --val-tokens FILE";
  } else if (!o.train.plan && !generating(o) && o.data_tokens.empty()) {
    return "--data-tokens FILE is needed to train (or --eval-only with --val-tokens)";
  }
  if (!o.dump_logits.empty() && !o.train.eval_only) return "--dump-logits needs --eval-only";
  if (o.train.resume && o.train.eval_only) return "--resume and --eval-only: give one";
  return "";
}

// The notices of train_llama's deprecated jobs: each names the program that does it now.
std::string deprecations(const Options& o) {
  std::string notice;
  if (generating(o)) {
    notice +=
        "warning: train_llama --generate-ids, --generate and --chat are deprecated: "
        "llama_generate takes the same flags (this run generates as before)\n";
  }
  if (o.train.plan) {
    notice +=
        "warning: train_llama --plan is deprecated: fsdp_plan takes the same flags without "
        "--plan (this run plans as before)\n";
  }
  if (!o.dump_logits.empty()) {
    notice +=
        "warning: train_llama --dump-logits is deprecated and will be removed: it is a test aid "
        "(the tests' tests/support/llama_dump_logits.cpp writes them from the same flags); "
        "this run writes them as before\n";
  }
  return notice;
}

ParseResult parsed(const Options& o, std::string notice = "") { return {o, 0, "", notice}; }

}  // namespace

ParseResult parse_options(int argc, char** argv, int world) {
  CLI::App app{
      std::string("Train (pretrain or fine-tune) or evaluate a Llama-family model with fsdp: "
                  "Hugging Face weights in and out, nanoGPT token files. llama_generate "
                  "generates, fsdp_plan plans a run.") +
      kLaunch};
  TrainingFlags flags;
  flags.add(app, /*with_plan_flag=*/true);
  auto& o = flags.o;
  add_logits_flags(app, o);
  add_generation_flags(app, o, flags.given);
  if (auto stop = trainer::parse_flags(app, argc, argv)) {
    return {std::nullopt, stop->exit_code, stop->message, ""};
  }
  prefer_command_line_model(o, argc, argv);
  const bool read_files = !o.train.plan;  // a plan reads no file of the run it plans
  const auto error = first_error({
      [&] { return flags.finish(world); },
      [&] { return check_model(o); },
      [&] { return generating(o) ? check_generation(o, flags.given) : ""; },
      [&] { return check_training(o); },
      [&] { return check_data(o, read_files); },
      [&] { return check_export(o, read_files); },
      [&] { return check_model_transforms(o); },
  });
  if (!error.empty()) return fail(error);
  return parsed(o, deprecations(o));
}

ParseResult parse_plan_options(int argc, char** argv, int world) {
  CLI::App app{
      "Plan a Llama-family training run without running it: the memory per rank and the "
      "communication per step that train_llama's flags (or --recipe) need at --plan-world ranks "
      "(default: the launched world, 1 when run alone), and with --plan-search the best layouts. "
      "Give the train_llama run's flags without --plan; the files they name need not exist "
      "here, only the model's config.json (or --preset). fsdp_plan minillm FLAGS plans a "
      "train_minillm run."};
  TrainingFlags flags;
  flags.add(app, /*with_plan_flag=*/false);
  auto& o = flags.o;
  if (auto stop = trainer::parse_flags(app, argc, argv)) {
    return {std::nullopt, stop->exit_code, stop->message, ""};
  }
  prefer_command_line_model(o, argc, argv);
  o.train.plan = true;
  const auto error = first_error({
      [&] { return flags.finish(world); },
      [&] { return check_model(o); },
      [&] { return check_data(o, /*read_files=*/false); },
      [&] { return check_model_transforms(o); },
  });
  if (!error.empty()) return fail(error);
  return parsed(o);
}

ParseResult parse_generate_options(int argc, char** argv, int world) {
  CLI::App app{
      std::string("Generate with a Llama-family model (Hugging Face weights, a PEFT adapter on "
                  "them if given): after prompt token ids, or a text through the model's "
                  "tokenizer and, with --chat, its chat template; sharded over the launched "
                  "ranks as in training, every rank drawing the same tokens.") +
      kLaunch};
  Options o;
  GivenFlags given;
  add_model_flags(app, o);
  add_lora_flags(app, o, given, /*adapter_only=*/true);
  add_tp_flags(app, o, /*with_sp=*/false);
  add_generation_flags(app, o, given);
  trainer::add_job_flags(app, o.train);
  if (auto stop = trainer::parse_flags(app, argc, argv)) {
    return {std::nullopt, stop->exit_code, stop->message, ""};
  }
  prefer_command_line_model(o, argc, argv);
  const auto error = first_error({
      [&] { return read_lora_adapter(o, given); },
      [&] { return trainer::check_job(o.train, world); },
      [&] { return check_model(o); },
      [&]() -> std::string {
        if (generating(o) || (given.generate && given.generate->count() > 0)) return "";
        return "give a prompt: --generate-ids IDS, or --generate TEXT (with --chat, the user's "
               "message)";
      },
      [&] { return check_generation(o, given); },
      [&] { return check_model_transforms(o); },
  });
  if (!error.empty()) return fail(error);
  return parsed(o);
}

}  // namespace llama
