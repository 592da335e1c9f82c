#include "minillm_options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <map>

#include "choice_flag.h"
#include "flag_checks.h"
#include "output_paths.h"

namespace minillm {
namespace {

struct Preset {
  fsdp::models::minillm::Config model;
  int64_t seq;
  int64_t batch_per_rank;
  int steps;
};

// "reference" is the PyTorch FSDP2 example's size (py_minillm.py); "cpu-small" runs 20 steps
// on 2 CPU ranks in about a minute.
const std::map<std::string, Preset>& presets() {
  static const std::map<std::string, Preset> p = {
      {"cpu-small", {{32000, 256, 4, 8}, 128, 4, 20}},
      {"reference", {{32000, 2048, 12, 16}, 1024, 8, 20}},
  };
  return p;
}

// MiniLLM's own flags (the loop's are checked by trainer::finish_train_options).
std::string check(const Options& o) {
  if (o.model.dim % o.model.heads != 0) {
    return fmt::format("--heads must divide --dim: {} heads do not divide dim {}", o.model.heads,
                       o.model.dim);
  }
  if (o.train.resume && !o.init_from.empty()) {
    return "--resume and --init-from both set the weights: give one";
  }
  // A plan reads no file of the run it plans: the run may be for another machine.
  const bool read_files = !o.train.plan;
  if (read_files && o.data != "auto" && o.data != "synthetic") {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.data, ec)) {
      return fmt::format(
          "--data {}: {} (expected a text file, 'synthetic' or 'auto')", o.data,
          std::filesystem::exists(o.data, ec) ? "not a regular file" : "no such file");
    }
    if (std::filesystem::file_size(o.data, ec) < static_cast<uintmax_t>(o.train.seq + 2)) {
      return fmt::format("--data {}: the file is shorter than one sequence of {} bytes + 1", o.data,
                         o.train.seq);
    }
  }
  if (read_files && !o.init_from.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.init_from, ec)) {
      return fmt::format("--init-from {}: no such file (expected a safetensors file)", o.init_from);
    }
  }
  if (read_files && !o.export_path.empty()) {
    if (auto err = trainer::check_new_file("--export", o.export_path); !err.empty()) return err;
  }
  if (o.train.eval_only || o.train.eval_every > 0) {
    return "train_minillm has no validation data: --eval-only and --eval-every are train_llama's "
           "(with --val-tokens)";
  }
  if (o.data != "synthetic" && o.model.vocab < 256) {
    return fmt::format("--vocab must be at least 256 to read text as bytes, got {}", o.model.vocab);
  }
  if (!o.model.float8 && o.model.float8_scaling != fsdp::ops::Float8Scaling::tensorwise) {
    return "--float8-recipe needs --float8";
  }
  if (!o.model.float8 && o.model.float8_attention) return "--float8-attention needs --float8";
  if (o.model.float8 && o.model.dim % 16 != 0) {
    return fmt::format("--float8: the feed-forward Linears ({} x {}) need --dim a multiple of 16",
                       o.model.dim, 4 * o.model.dim);
  }
  return "";
}

// The sizes a preset fills where the flag is not given.
struct Sizes {
  std::optional<int64_t> vocab, dim, layers, heads, seq, batch;
  std::optional<int> steps;
};

// train_minillm's own flags, in their sections: the model's preset and sizes, the data, the
// weights in and out.
void add_minillm_flags(CLI::App& app, Options& o, Sizes& sizes) {
  trainer::add_section(app, "model", [&] {
    app.add_option("--preset", o.preset, "Sizes to start from")
        ->check(CLI::IsMember({"cpu-small", "reference"}));
    app.add_option("--vocab", sizes.vocab, "Vocabulary size (>= 256 for text)")
        ->check(trainer::positive());
    app.add_option("--dim", sizes.dim, "Model width")->check(trainer::positive());
    app.add_option("--layers", sizes.layers, "Transformer blocks")->check(trainer::positive());
    app.add_option("--heads", sizes.heads, "Attention heads (must divide --dim)")
        ->check(trainer::positive());
  });
  trainer::add_section(app, "data", [&] {
    app.add_option("--seq", sizes.seq, "Tokens per sequence")->check(trainer::positive());
    app.add_option("--batch", sizes.batch,
                   "Global batch in sequences, split evenly over ranks (preset: 4 per rank for "
                   "cpu-small, 8 per rank for reference)")
        ->check(trainer::positive());
    app.add_option("--data", o.data,
                   fmt::format("'auto' ({} as bytes, else synthetic), 'synthetic', or a text file",
                               kDefaultTextPath));
  });
  trainer::add_section(app, "optimizer", [&] {
    app.add_option("--steps", sizes.steps, "Training steps")->check(trainer::positive());
  });
  trainer::add_section(app, "checkpoint", [&] {
    app.add_option("--export", o.export_path,
                   "After training, write the whole model to this safetensors file (PyTorch's "
                   "names)");
    trainer::add_choice(app, "--export-dtype", o.export_dtype, "fp32 or bf16");
    app.add_option("--init-from", o.init_from,
                   "Start from the weights in this safetensors file (names as PyTorch's MiniLLM, "
                   "e.g. written by bench/reference/py_minillm.py --save-init)");
  });
  trainer::add_section(app, "float8", [&] {
    app.add_flag("--float8", o.model.float8,
                 "float8 training of the blocks' feed-forward Linears (torchao's Float8Linear, "
                 "what it converts in this model; --float8-recipe; the attention's too with "
                 "--float8-attention); --dim a multiple of 16. On the CPU, or a GPU of compute "
                 "capability 8.9 or newer (rowwise: 8.9, 9.x, 10.x)");
    trainer::add_choice(app, "--float8-recipe", o.model.float8_scaling,
                        "With --float8: torchao's recipe, tensorwise or rowwise (a power-of-2 "
                        "scale per row of each GEMM operand, all in e4m3)");
    app.add_flag("--float8-attention", o.model.float8_attention,
                 "With --float8: the attention's input and output projections in float8 too "
                 "(torchao cannot convert them in this model: its float8 reference leaves them "
                 "in high precision)");
  });
}

// train_minillm's flags, or with `plan_program` fsdp_plan minillm's (the same without --plan).
ParseResult parse(int argc, char** argv, int world_size, bool plan_program) {
  CLI::App app{plan_program
                   ? "Plan a MiniLLM training run without running it: the memory per rank and the "
                     "communication per step that train_minillm's flags (or --recipe) need at "
                     "--plan-world ranks (default: the launched world, 1 when run alone), and "
                     "with --plan-search the best layouts. Give the train_minillm run's flags "
                     "without --plan."
                   : "Train MiniLLM with fsdp (fully sharded data parallel) on CPU or GPU ranks.\n"
                     "Launch: mpirun -np N, torchrun --no-python --nproc-per-node N, or "
                     "scripts/launch.sh --nproc N. fsdp_plan minillm plans a run."};
  Options o;
  Sizes sizes;
  add_minillm_flags(app, o, sizes);
  // The loop's flags. MiniLLM keeps the PyTorch FSDP2 example's optimizer: AdamW(lr 3e-4),
  // betas (0.9, 0.999), weight decay 0.01, a constant learning rate.
  std::string profile_steps;
  trainer::add_train_flags(app, o.train, trainer::TrainDefaults{}, profile_steps,
                           /*with_plan_flag=*/!plan_program);
  if (auto stop = trainer::parse_flags(app, argc, argv)) {
    return {std::nullopt, stop->exit_code, stop->message, ""};
  }
  auto& t = o.train;
  const bool deprecated_plan = t.plan;
  if (plan_program) t.plan = true;
  const Preset& p = presets().at(o.preset);
  o.model.vocab = sizes.vocab.value_or(p.model.vocab);
  o.model.dim = sizes.dim.value_or(p.model.dim);
  o.model.layers = sizes.layers.value_or(p.model.layers);
  o.model.heads = sizes.heads.value_or(p.model.heads);
  t.seq = sizes.seq.value_or(p.seq);
  // A plan describes another world than the one launched (usually one process).
  if (t.plan && t.plan_world > 0) world_size = t.plan_world;
  t.plan_world = world_size;
  t.batch = sizes.batch.value_or(p.batch_per_rank * world_size);
  t.steps = sizes.steps.value_or(p.steps);
  for (const auto& err : {trainer::finish_train_options(t, profile_steps, world_size), check(o)}) {
    if (!err.empty()) return {std::nullopt, 2, "error: " + err, ""};
  }
  const char* notice =
      deprecated_plan ? "warning: train_minillm --plan is deprecated: fsdp_plan minillm takes the "
                        "same flags without --plan (this run plans as before)\n"
                      : "";
  return {o, 0, "", notice};
}

}  // namespace

ParseResult parse_options(int argc, char** argv, int world_size) {
  return parse(argc, argv, world_size, /*plan_program=*/false);
}

ParseResult parse_plan_options(int argc, char** argv, int world_size) {
  return parse(argc, argv, world_size, /*plan_program=*/true);
}

}  // namespace minillm
