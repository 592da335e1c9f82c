#include "train_options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <sstream>

#include "choice_flag.h"
#include "flag_checks.h"
#include "output_paths.h"

namespace trainer {

namespace {

// --threads: more than this is a typo (a process of 100,000 threads did not start in minutes).
constexpr double kMaxThreads = 1024;
// --comm-timeout: a week; seconds beyond it overflow the milliseconds the engines take.
constexpr double kMaxCommTimeoutS = 7 * 24 * 3600;

void add_memory_flags(CLI::App& app, TrainOptions& o) {
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "Keep only each block's input after forward and recompute its activations in "
               "backward (less memory, about one more forward of compute)");
  app.add_flag("--init-full-model", o.init_full_model,
               "Build the whole model on every rank, then shard it (the default shards each "
               "block as it is built: same values, a fraction of the memory)");
  app.add_flag("!--no-reshard-after-forward", o.reshard_after_forward,
               "Keep blocks' full parameters from forward to backward (more memory, fewer "
               "all-gathers)");
  add_choice(app, "--offload", o.offload,
             "Host memory for what a step does not compute with: none; optimizer (AdamW's "
             "moments on the host and its step on the CPU: 8 bytes per parameter off the "
             "device; needs --optimizer fused-adamw); all (FSDP2's CPU offload: the sharded "
             "parameters, gradients and optimizer state on the host, each all-gather copies "
             "the shards in first)");
  app.add_option("--quantize-all-gather", o.quantize_all_gather,
                 "Quantized weight all-gather (ZeRO++'s qwZ): every unit gathers its parameters "
                 "as int8 in blocks of this many elements, one float32 scale each, and computes "
                 "with the dequantized weights (about 1/4 of fp32's bytes, 1/2 of bf16's); the "
                 "shards, gradients and optimizer keep full precision. 0: off")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            int64_t v = 0;
            if (!CLI::detail::lexical_cast(text, v) || v == 0) return "";
            if (v >= 4 && v <= (1 << 20) && v % 4 == 0) return "";
            return "must be a block size, a multiple of 4 in [4, 1048576] (or 0: off), got " + text;
          },
          "0 OR 4N"));
  app.add_option("--replicas", o.replicas,
                 "Hybrid sharding (HSDP): replicas of the model, each sharded over world / "
                 "replicas consecutive ranks; gradients are all-reduced across replicas");
}

// [job]'s flags of a training run (add_job_flags has those of any run).
void add_run_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--metrics-out", o.metrics_out,
                 "Write one JSON object per step (and per validation) to this file");
  add_choice(app, "--nonfinite", o.nonfinite,
             "A step whose loss or global gradient norm is NaN or infinite (on any rank): stop "
             "with an error naming it, skip its optimizer step (counted), or off (no check; "
             "saves one all-reduce per step)");
}

// [model]'s flags of a training run: the loss.
void add_loss_flags(CLI::App& app, TrainOptions& o) {
  app.add_flag("--fused-loss", o.fused_loss,
               "Train with the head and the cross-entropy fused (chunked: the [tokens, vocabulary] "
               "logits never exist; the same loss and gradients)");
  app.add_option("--loss-chunk", o.loss_chunk,
                 "With --fused-loss: tokens per chunk (0: about tokens x hidden / vocabulary)")
      ->check(non_negative(" (0: automatic)"));
}

void add_optimizer_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--lr", o.lr, "Peak learning rate (AdamW)")->check(positive());
  app.add_option("--warmup", o.warmup,
                 "Steps of linear warmup: step s < W trains at lr * (s + 1) / W")
      ->check(non_negative());
  add_choice(app, "--lr-schedule", o.lr_schedule,
             "After warmup: constant, or cosine from --lr down to --lr-min at the last step");
  app.add_option("--lr-min", o.lr_min, "The cosine schedule's last learning rate");
  app.add_option("--weight-decay", o.weight_decay,
                 "AdamW's decoupled weight decay, on parameters of 2 or more dimensions only "
                 "(norms and biases get none)")
      ->check(non_negative());
  app.add_option("--beta1", o.beta1, "AdamW's beta1")->check(in_half_open(0, 1));
  app.add_option("--beta2", o.beta2, "AdamW's beta2")->check(in_half_open(0, 1));
  add_choice(app, "--optimizer", o.optimizer,
             "fused-adamw: fsdp::FusedAdamW (one fused kernel per parameter group); adamw: "
             "libtorch's torch::optim::AdamW (nine ops per parameter)");
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "Clip the gradients to this global 2-norm (over all ranks' shards) before each "
                 "optimizer step; 0: no clipping")
      ->check(non_negative(" (0: off)"));
  app.add_option("--grad-accum", o.grad_accum,
                 "Micro-batches per step: each rank's batch is split into this many, their "
                 "gradients accumulate unsharded (no communication) and are reduced once")
      ->check(positive());
  app.add_flag("--grad-accum-sync", o.grad_accum_sync,
               "With --grad-accum: reduce-scatter after every micro-batch instead (less memory: "
               "no full gradients kept; more communication)");
}

void add_checkpoint_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--save-dir", o.save_dir,
                 "Write sharded checkpoints (parameters and optimizer state) to this directory");
  app.add_option("--save-every", o.save_every,
                 "Steps between checkpoints (0: one at the end); needs --save-dir")
      ->check(non_negative());
  app.add_option("--keep", o.keep, "Checkpoints to keep, the newest (0: all)")
      ->check(non_negative());
  app.add_flag("--resume", o.resume,
               "Continue from the latest complete checkpoint in --save-dir, saved at any world "
               "size (none there: start from step 0)");
}

void add_validation_flags(CLI::App& app, TrainOptions& o) {
  app.add_option("--eval-every", o.eval_every,
                 "Validation loss every N steps and after the last (0: after the last only, when "
                 "there is validation data)")
      ->check(non_negative());
  app.add_flag("--eval-only", o.eval_only,
               "Print the validation loss of the weights given and exit, without training");
  app.add_option("--eval-batch", o.eval_batch, "Validation windows per forward")->check(positive());
}

void add_profiling_flags(CLI::App& app, TrainOptions& o, std::string& profile_steps) {
  app.add_option("--profile-steps", profile_steps,
                 "Profile steps A to B (A:B, inclusive, 0-based) with libtorch's profiler: one "
                 "Chrome/Perfetto trace per rank in --profile-dir, and rank 0 prints the top "
                 "operators and FSDP's communication figures");
  app.add_option("--profile-dir", o.profile_dir, "Where --profile-steps writes its traces");
  app.add_flag("!--no-profile-shapes", o.profile_shapes,
               "Leave operator shapes and FLOPs out of the trace (less profiling overhead; "
               "scripts/roofline.py needs them)");
  app.add_flag("--track-host-memory", o.track_host_memory,
               "Count CPU tensor bytes; --metrics-out gets each step's peak (rank 0's)");
}

}  // namespace

void add_job_flags(CLI::App& app, TrainOptions& o) {
  add_section(app, "job", [&] {
    app.add_option("--seed", o.seed, "Seed of parameters and data")->check(non_negative());
    app.add_option("--threads", o.threads,
                   "Intra-op threads per rank (0: OMP_NUM_THREADS if set, else cores / local "
                   "ranks)")
        ->check(in_closed(0, kMaxThreads));
    app.add_option("--comm-timeout", o.comm_timeout_s,
                   "Seconds a collective or the rendezvous may wait for the other ranks before "
                   "the run fails with an error naming the operation (a dead or stuck rank)")
        ->check(in_open_closed(0, kMaxCommTimeoutS));
  });
  add_section(app, "model", [&] {
    add_choice(app, "--dtype", o.dtype, "fp32, or bf16 (bf16 compute, fp32 reduce and master)");
  });
}

void add_plan_flags(CLI::App& app, TrainOptions& o, bool with_plan_flag) {
  add_section(app, "plan", [&] {
    if (with_plan_flag) {
      app.add_flag("--plan", o.plan,
                   "Print the memory per rank and the communication per step these flags need "
                   "(the planner), then exit without training");
    }
    app.add_option("--plan-world", o.plan_world, "World size to plan for (0: the launched one)")
        ->check(non_negative());
    app.add_option("--plan-ranks-per-host", o.plan_ranks_per_host,
                   "Ranks per machine, consecutive (0: all on one machine)")
        ->check(non_negative());
    app.add_option("--plan-collectives", o.plan_collectives,
                   "Measured collective times (collectives_bench --table) instead of --plan-links");
    app.add_option("--plan-links", o.plan_links,
                   "INTRA,INTER,LATENCY: bus bandwidth in GB/s within and between machines and "
                   "microseconds per collective (default: typical H200 NVLink and 400 Gb/s "
                   "InfiniBand figures, assumed)");
    app.add_option("--plan-capacity-gib", o.plan_capacity_gib,
                   "Memory per rank in GiB (0: not checked); the plan fails naming the numbers "
                   "when it does not fit")
        ->check(non_negative());
    app.add_option("--plan-json", o.plan_json, "Also write the plan as JSON to this file");
    app.add_option("--plan-search", o.plan_search,
                   "Also print this many of the best layouts of --plan-world ranks (replicas x "
                   "shards x tensor-parallel degree, TP within a host) that fit "
                   "--plan-capacity-gib, by communication per step")
        ->check(non_negative());
  });
}

void add_train_flags(CLI::App& app, TrainOptions& o, const TrainDefaults& defaults,
                     std::string& profile_steps, bool with_plan_flag) {
  o.lr = defaults.lr;
  o.beta2 = defaults.beta2;
  o.weight_decay = defaults.weight_decay;
  o.lr_schedule = defaults.lr_schedule;
  add_job_flags(app, o);
  add_section(app, "job", [&] { add_run_flags(app, o); });
  add_section(app, "model", [&] { add_loss_flags(app, o); });
  add_section(app, "parallelism", [&] { add_memory_flags(app, o); });
  add_section(app, "optimizer", [&] { add_optimizer_flags(app, o); });
  add_section(app, "checkpoint", [&] { add_checkpoint_flags(app, o); });
  add_section(app, "validation", [&] { add_validation_flags(app, o); });
  add_section(app, "profiling", [&] { add_profiling_flags(app, o, profile_steps); });
  add_plan_flags(app, o, with_plan_flag);
}

namespace {

// The batch's split over the data-parallel ranks and micro-batches, and the layout's degrees.
std::string check_layout(const TrainOptions& o, int world) {
  if (o.sp && (o.tp < 2 || o.seq % o.tp != 0)) {
    return fmt::format(
        "--sp splits the sequence over the --tp ranks: it needs --tp of at least 2 and a --seq "
        "that divides by it (got --tp {}, --seq {})",
        o.tp, o.seq);
  }
  // The data-parallel ranks: each sees its own part of the batch (the TP ranks of one share it).
  const int dp = world / o.tp;
  const std::string over =
      o.tp > 1 ? fmt::format("{} data-parallel ranks (world {} / --tp {})", dp, world, o.tp)
               : fmt::format("{} ranks", dp);
  if (o.batch % dp != 0) {
    return fmt::format(
        "--batch is the global batch in sequences and must split evenly over the {}: {} does "
        "not divide by {} (use a multiple of {})",
        over, o.batch, dp, dp);
  }
  if (o.replicas < 1 || o.replicas > dp || dp % o.replicas != 0) {
    if (o.tp == 1) {
      return fmt::format(
          "--replicas {} must divide the world of {} ranks (each replica is sharded over world / "
          "replicas ranks)",
          o.replicas, world);
    }
    return fmt::format("--replicas {} must divide the {} (each replica is sharded over the rest)",
                       o.replicas, over);
  }
  if ((o.batch / dp) % o.grad_accum != 0) {
    return fmt::format(
        "--grad-accum {} must divide the {} sequences each rank trains on per step (--batch {} "
        "over {})",
        o.grad_accum, o.batch / dp, o.batch, over);
  }
  return "";
}

std::string check_optimizer(const TrainOptions& o) {
  if (!(o.lr_min >= 0) || o.lr_min > o.lr) {
    return fmt::format("--lr-min must lie in [0, --lr {}], got {}", o.lr, o.lr_min);
  }
  if (o.offload == Offload::optimizer && o.optimizer != OptimizerKind::fused_adamw) {
    return fmt::format(
        "--offload optimizer keeps fsdp::FusedAdamW's state on the host; --optimizer {} has no "
        "such mode (use --optimizer fused-adamw, or --offload all, which offloads any optimizer "
        "with the parameters)",
        name(o.optimizer));
  }
  return "";
}

// Checkpoints, validation, profiling and planning.
std::string check_outputs(const TrainOptions& o, int world) {
  if ((o.save_every > 0 || o.keep > 0 || o.resume) && o.save_dir.empty()) {
    return "--save-every, --keep and --resume need --save-dir DIR";
  }
  if (o.profile_last >= o.steps) {
    return fmt::format("--profile-steps {}:{} reaches past the last step ({} steps, 0-based)",
                       o.profile_first, o.profile_last, o.steps);
  }
  if (o.plan_ranks_per_host > 0 && world % o.plan_ranks_per_host != 0) {
    return fmt::format("--plan-ranks-per-host {} must divide the world of {} ranks",
                       o.plan_ranks_per_host, world);
  }
  // A plan writes none of the run's files: the run may be for another machine.
  if (o.plan) return "";
  if (auto err = check_save_dir(o); !err.empty()) return err;
  if (!o.metrics_out.empty()) return check_writable_file("--metrics-out", o.metrics_out);
  return "";
}

std::string check(const TrainOptions& o, int world) {
  // In order: the layout's check divides by --tp, which check_job proves divides the world.
  if (auto err = check_job(o, world); !err.empty()) return err;
  if (auto err = check_layout(o, world); !err.empty()) return err;
  if (auto err = check_optimizer(o); !err.empty()) return err;
  if (auto err = check_outputs(o, world); !err.empty()) return err;
  if (o.loss_chunk > 0 && !o.fused_loss) return "--loss-chunk needs --fused-loss";
  return "";
}

}  // namespace

std::string check_job(const TrainOptions& o, int world) {
  if (o.tp < 1 || world % o.tp != 0) {
    return fmt::format(
        "--tp {} must divide the world of {} ranks (each group of --tp consecutive ranks splits "
        "the model's matmuls; the world / tp groups see different batches)",
        o.tp, world);
  }
  return "";
}

std::optional<ParseStop> parse_flags(CLI::App& app, int argc, char** argv) {
  use_sections(app);
  // Every option's value as registered is its default in --help (a choice and a flag carry
  // theirs already, and have nothing to capture).
  for (CLI::Option* option : app.get_options()) option->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return ParseStop{0, app.help()};
  } catch (const CLI::ParseError& e) {
    return ParseStop{
        2, fmt::format("error: {}\nRun with --help for the flags and their defaults.", e.what())};
  }
  // CLI11 takes an empty value ("--steps ''", what an unset "$VAR" gives) as the flag's
  // default, or an empty path as no path: the run would silently do something else than asked.
  for (const CLI::Option* option : app.get_options()) {
    if (option->get_expected_min() == 0) continue;  // a flag without a value
    for (const auto& value : option->results()) {
      if (value.empty()) {
        return ParseStop{2, fmt::format("error: {}: an empty value; give one, or leave the flag "
                                        "out for its default",
                                        option->get_name())};
      }
    }
  }
  return std::nullopt;
}

std::string finish_train_options(TrainOptions& o, const std::string& profile_steps, int world) {
  if (!profile_steps.empty()) {
    int a = -1, b = -1;
    char colon = 0;
    std::istringstream in(profile_steps);
    if (!(in >> a >> colon >> b) || colon != ':' || !in.eof() || a < 0 || b < a) {
      return fmt::format(
          "--profile-steps {}: expected A:B with 0 <= A <= B (steps A to B, 0-based), e.g. 2:4",
          profile_steps);
    }
    o.profile_first = a;
    o.profile_last = b;
  }
  return check(o, world);
}

}  // namespace trainer
