// Command-line options of train_minillm: flags, presets, and their validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/models/minillm.h"

namespace minillm {

struct Options {
  std::string preset = "cpu-small";
  fsdp::models::minillm::Config model;
  int64_t seq = 128;
  int64_t batch = 8;  // global: sequences per step over all ranks
  int steps = 20;
  double lr = 3e-4;
  uint64_t seed = 0;
  std::string dtype = "fp32";  // fp32 | bf16
  std::string data = "auto";   // auto | synthetic | PATH
  std::string metrics_out;
  std::string init_from;  // safetensors file with the initial weights (PyTorch's names)
  int threads = 0;        // intra-op threads per rank; 0: cores / local ranks
  bool reshard_after_forward = true;
  std::string optimizer = "fused-adamw";  // fused-adamw (fsdp::FusedAdamW) | adamw (libtorch's)
  double clip_grad_norm = 0;     // > 0: clip gradients to this global 2-norm before each step
  int grad_accum = 1;            // micro-batches per step, the rank's batch split evenly
  bool grad_accum_sync = false;  // reduce-scatter after every micro-batch instead of once
  bool activation_checkpointing = false;  // recompute each block's activations in backward
  bool init_full_model = false;           // build the whole model, then shard
  std::string save_dir;                   // sharded checkpoints go here
  int save_every = 0;                     // steps between checkpoints (0: only at the end)
  int keep = 0;                           // checkpoints kept (0: all)
  bool resume = false;                    // start from the latest checkpoint in save_dir
  std::string export_path;                // safetensors file of the trained model
  std::string export_dtype = "fp32";
  std::string nonfinite = "stop";             // stop | skip | off: a NaN/inf loss or gradient norm
  int profile_first = -1, profile_last = -1;  // --profile-steps A:B (inclusive); -1: off
  std::string profile_dir = "profile";
  bool profile_shapes = true;  // record operator shapes and FLOPs (scripts/roofline.py)
  double comm_timeout_s = 60;  // a collective (or the rendezvous) waiting longer fails the run
  int replicas = 1;  // hybrid sharding: model replicas, each sharded over world / replicas ranks
  bool track_host_memory = false;  // count CPU tensor bytes (host_tensor_peak_bytes per step)
  // --plan: print what a run with these flags needs (fsdp/tools/planner.h) instead of training.
  bool plan = false;
  int plan_world = 0;                    // the world to plan for (0: the launched one)
  int plan_ranks_per_host = 0;           // consecutive ranks per machine (0: one machine)
  std::string plan_collectives;          // collectives_bench --table CSV: measured times
  std::string plan_links = "350,45,20";  // busbw GB/s within, between hosts; latency us
  double plan_capacity_gib = 0;          // memory per rank; 0: not checked
  std::string plan_json;                 // write the plan as JSON here
};

// What parse_options decided: run with `options`, or exit with `exit_code` after printing
// `message` (help text or the error, naming the flag and what is expected).
struct ParseResult {
  std::optional<Options> options;
  int exit_code = 0;
  std::string message;
};

// Parses argv. Presets fill every size flag the user did not give. `world_size` (from the
// launch environment) is needed to check that the global batch splits over the ranks.
ParseResult parse_options(int argc, char** argv, int world_size);

// The text file `--data auto` reads: present on every Debian machine (package base-files).
inline constexpr const char* kDefaultTextPath = "/usr/share/common-licenses/GPL-3";

}  // namespace minillm
