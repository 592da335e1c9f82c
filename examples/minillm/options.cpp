#include "options.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <filesystem>
#include <map>
#include <sstream>

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

std::string check(const Options& o, int world_size) {
  auto positive = [](int64_t v, const char* flag) -> std::string {
    return v > 0 ? "" : fmt::format("{} must be a positive integer, got {}", flag, v);
  };
  for (auto err :
       {positive(o.model.vocab, "--vocab"), positive(o.model.dim, "--dim"),
        positive(o.model.layers, "--layers"), positive(o.model.heads, "--heads"),
        positive(o.seq, "--seq"), positive(o.batch, "--batch"), positive(o.steps, "--steps")}) {
    if (!err.empty()) return err;
  }
  if (o.model.dim % o.model.heads != 0) {
    return fmt::format("--heads must divide --dim: {} heads do not divide dim {}", o.model.heads,
                       o.model.dim);
  }
  if (o.batch % world_size != 0) {
    return fmt::format(
        "--batch is the global batch in sequences and must split evenly over the {} ranks: "
        "{} does not divide by {} (use a multiple of {})",
        world_size, o.batch, world_size, world_size);
  }
  if (o.replicas < 1 || o.replicas > world_size || world_size % o.replicas != 0) {
    return fmt::format(
        "--replicas {} must divide the world of {} ranks (each replica is sharded over world / "
        "replicas ranks)",
        o.replicas, world_size);
  }
  if (o.plan_ranks_per_host < 0 ||
      (o.plan_ranks_per_host > 0 && world_size % o.plan_ranks_per_host != 0)) {
    return fmt::format("--plan-ranks-per-host {} must divide the world of {} ranks",
                       o.plan_ranks_per_host, world_size);
  }
  if (!(o.plan_capacity_gib >= 0)) {
    return fmt::format("--plan-capacity-gib must be >= 0, got {}", o.plan_capacity_gib);
  }
  if (o.grad_accum < 1) {
    return fmt::format("--grad-accum must be a positive integer, got {}", o.grad_accum);
  }
  if ((o.batch / world_size) % o.grad_accum != 0) {
    return fmt::format(
        "--grad-accum {} must divide the {} sequences each rank trains on per step (--batch {} "
        "over {} ranks)",
        o.grad_accum, o.batch / world_size, o.batch, world_size);
  }
  if (!(o.lr > 0)) return fmt::format("--lr must be positive, got {}", o.lr);
  if (!(o.clip_grad_norm >= 0) || std::isinf(o.clip_grad_norm)) {
    return fmt::format("--clip-grad-norm must be a finite number >= 0 (0: off), got {}",
                       o.clip_grad_norm);
  }
  if (o.save_every < 0) return fmt::format("--save-every must be >= 0, got {}", o.save_every);
  if (o.keep < 0) return fmt::format("--keep must be >= 0, got {}", o.keep);
  if ((o.save_every > 0 || o.keep > 0 || o.resume) && o.save_dir.empty()) {
    return "--save-every, --keep and --resume need --save-dir DIR";
  }
  if (o.resume && !o.init_from.empty()) {
    return "--resume and --init-from both set the weights: give one";
  }
  if (o.profile_last >= o.steps) {
    return fmt::format("--profile-steps {}:{} reaches past the last step ({} steps, 0-based)",
                       o.profile_first, o.profile_last, o.steps);
  }
  if (o.threads < 0) return fmt::format("--threads must be >= 0, got {}", o.threads);
  if (o.data != "auto" && o.data != "synthetic") {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.data, ec)) {
      return fmt::format("--data {}: no such file (expected a text file, 'synthetic' or 'auto')",
                         o.data);
    }
    if (std::filesystem::file_size(o.data, ec) < static_cast<uintmax_t>(o.seq + 2)) {
      return fmt::format("--data {}: the file is shorter than one sequence of {} bytes + 1", o.data,
                         o.seq);
    }
  }
  if (!o.init_from.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(o.init_from, ec)) {
      return fmt::format("--init-from {}: no such file (expected a safetensors file)", o.init_from);
    }
  }
  if (o.data != "synthetic" && o.model.vocab < 256) {
    return fmt::format("--vocab must be at least 256 to read text as bytes, got {}", o.model.vocab);
  }
  return "";
}

}  // namespace

ParseResult parse_options(int argc, char** argv, int world_size) {
  CLI::App app{
      "Train MiniLLM with fsdp (fully sharded data parallel) on CPU or GPU ranks.\n"
      "Launch: mpirun -np N, torchrun --no-python --nproc-per-node N, or "
      "scripts/launch.sh --nproc N."};
  Options o;
  std::optional<int64_t> vocab, dim, layers, heads, seq, batch;
  std::optional<int> steps;
  app.add_option("--preset", o.preset, "Sizes to start from")
      ->check(CLI::IsMember({"cpu-small", "reference"}))
      ->capture_default_str();
  app.add_option("--vocab", vocab, "Vocabulary size (>= 256 for text)");
  app.add_option("--dim", dim, "Model width");
  app.add_option("--layers", layers, "Transformer blocks");
  app.add_option("--heads", heads, "Attention heads (must divide --dim)");
  app.add_option("--seq", seq, "Tokens per sequence");
  app.add_option("--batch", batch,
                 "Global batch in sequences, split evenly over ranks (preset: 4 per rank for "
                 "cpu-small, 8 per rank for reference)");
  app.add_option("--steps", steps, "Training steps");
  app.add_option("--lr", o.lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of parameters and data")->capture_default_str();
  app.add_option("--dtype", o.dtype, "fp32, or bf16 (bf16 compute, fp32 reduce and master)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--data", o.data,
                 fmt::format("'auto' ({} as bytes, else synthetic), 'synthetic', or a text file",
                             kDefaultTextPath))
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer,
                 "fused-adamw: fsdp::FusedAdamW (one fused kernel per parameter group); adamw: "
                 "libtorch's torch::optim::AdamW (nine ops per parameter)")
      ->check(CLI::IsMember({"fused-adamw", "adamw"}))
      ->capture_default_str();
  app.add_option("--clip-grad-norm", o.clip_grad_norm,
                 "Clip the gradients to this global 2-norm (over all ranks' shards) before each "
                 "optimizer step; 0: no clipping")
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum,
                 "Micro-batches per step: each rank's batch is split into this many, their "
                 "gradients accumulate unsharded (no communication) and are reduced once")
      ->capture_default_str();
  app.add_flag("--grad-accum-sync", o.grad_accum_sync,
               "With --grad-accum: reduce-scatter after every micro-batch instead (less memory: "
               "no full gradients kept; more communication)");
  app.add_flag("--activation-checkpointing", o.activation_checkpointing,
               "Keep only each block's input after forward and recompute its activations in "
               "backward (less memory, about one more forward of compute)");
  app.add_flag("--init-full-model", o.init_full_model,
               "Build the whole model on every rank, then shard it (the default shards each "
               "block as it is built: same values, a fraction of the memory)");
  app.add_option("--save-dir", o.save_dir,
                 "Write sharded checkpoints (parameters and optimizer state) to this directory");
  app.add_option("--save-every", o.save_every,
                 "Steps between checkpoints (0: one at the end); needs --save-dir")
      ->capture_default_str();
  app.add_option("--keep", o.keep, "Checkpoints to keep, the newest (0: all)")
      ->capture_default_str();
  app.add_flag("--resume", o.resume,
               "Continue from the latest complete checkpoint in --save-dir, saved at any world "
               "size (none there: start from step 0)");
  app.add_option("--export", o.export_path,
                 "After training, write the whole model to this safetensors file (PyTorch's "
                 "names)");
  app.add_option("--export-dtype", o.export_dtype, "fp32 or bf16")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  app.add_option("--nonfinite", o.nonfinite,
                 "A step whose loss or global gradient norm is NaN or infinite (on any rank): "
                 "stop with an error naming it, skip its optimizer step (counted), or off (no "
                 "check; saves one all-reduce per step)")
      ->check(CLI::IsMember({"stop", "skip", "off"}))
      ->capture_default_str();
  std::string profile_steps;
  app.add_option("--profile-steps", profile_steps,
                 "Profile steps A to B (A:B, inclusive, 0-based) with libtorch's profiler: one "
                 "Chrome/Perfetto trace per rank in --profile-dir, and rank 0 prints the top "
                 "operators and FSDP's communication figures");
  app.add_option("--profile-dir", o.profile_dir, "Where --profile-steps writes its traces")
      ->capture_default_str();
  app.add_flag("!--no-profile-shapes", o.profile_shapes,
               "Leave operator shapes and FLOPs out of the trace (less profiling overhead; "
               "scripts/roofline.py needs them)");
  app.add_option("--comm-timeout", o.comm_timeout_s,
                 "Seconds a collective or the rendezvous may wait for the other ranks before the "
                 "run fails with an error naming the operation (a dead or stuck rank)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--metrics-out", o.metrics_out, "Write one JSON object per step to this file");
  app.add_option("--init-from", o.init_from,
                 "Start from the weights in this safetensors file (names as PyTorch's MiniLLM, "
                 "e.g. written by bench/reference/py_minillm.py --save-init)");
  app.add_option("--threads", o.threads, "Intra-op threads per rank (0: cores / local ranks)")
      ->capture_default_str();
  app.add_option("--replicas", o.replicas,
                 "Hybrid sharding (HSDP): replicas of the model, each sharded over world / "
                 "replicas consecutive ranks; gradients are all-reduced across replicas")
      ->capture_default_str();
  app.add_flag("--track-host-memory", o.track_host_memory,
               "Count CPU tensor bytes; --metrics-out gets each step's peak (rank 0's)");
  app.add_flag("--plan", o.plan,
               "Print the memory per rank and the communication per step these flags need "
               "(the planner), then exit without training");
  app.add_option("--plan-world", o.plan_world,
                 "World size to plan for (default: the launched one)");
  app.add_option("--plan-ranks-per-host", o.plan_ranks_per_host,
                 "Ranks per machine, consecutive (0: all on one machine)")
      ->capture_default_str();
  app.add_option("--plan-collectives", o.plan_collectives,
                 "Measured collective times (collectives_bench --table) instead of --plan-links");
  app.add_option("--plan-links", o.plan_links,
                 "INTRA,INTER,LATENCY: bus bandwidth in GB/s within and between machines and "
                 "microseconds per collective (default: typical H200 NVLink and 400 Gb/s "
                 "InfiniBand figures, assumed)")
      ->capture_default_str();
  app.add_option("--plan-capacity-gib", o.plan_capacity_gib,
                 "Memory per rank in GiB; the plan fails naming the numbers when it does not fit");
  app.add_option("--plan-json", o.plan_json, "Also write the plan as JSON to this file");
  app.add_flag("!--no-reshard-after-forward", o.reshard_after_forward,
               "Keep blocks' full parameters from forward to backward (more memory, fewer "
               "all-gathers)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return {std::nullopt, 0, app.help()};
  } catch (const CLI::ParseError& e) {
    return {std::nullopt, 2,
            fmt::format("error: {}\nRun with --help for the flags and their defaults.", e.what())};
  }
  if (!profile_steps.empty()) {
    int a = -1, b = -1;
    char colon = 0;
    std::istringstream in(profile_steps);
    if (!(in >> a >> colon >> b) || colon != ':' || !in.eof() || a < 0 || b < a) {
      return {std::nullopt, 2,
              fmt::format("error: --profile-steps {}: expected A:B with 0 <= A <= B (steps A to "
                          "B, 0-based), e.g. 2:4",
                          profile_steps)};
    }
    o.profile_first = a;
    o.profile_last = b;
  }
  const Preset& p = presets().at(o.preset);
  o.model.vocab = vocab.value_or(p.model.vocab);
  o.model.dim = dim.value_or(p.model.dim);
  o.model.layers = layers.value_or(p.model.layers);
  o.model.heads = heads.value_or(p.model.heads);
  o.seq = seq.value_or(p.seq);
  if (o.plan && o.plan_world < 0) {
    return {std::nullopt, 2,
            fmt::format("error: --plan-world must be positive, got {}", o.plan_world)};
  }
  // --plan describes another world than the one launched (usually one process).
  if (o.plan && o.plan_world > 0) world_size = o.plan_world;
  o.plan_world = world_size;
  o.batch = batch.value_or(p.batch_per_rank * world_size);
  o.steps = steps.value_or(p.steps);
  if (auto err = check(o, world_size); !err.empty()) {
    return {std::nullopt, 2, "error: " + err};
  }
  return {o, 0, ""};
}

}  // namespace minillm
