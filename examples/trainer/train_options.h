// The flags every trainer of this project has (train_minillm, train_llama): the training loop's,
// as opposed to a model's sizes or data. A trainer registers them beside its own flags and
// checks them after parsing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "choices.h"
#include "sections.h"

namespace CLI {  // <CLI/CLI.hpp>, included by the sources that add or parse flags
class App;
}  // namespace CLI

namespace trainer {

struct TrainOptions {
  int64_t seq = 128;
  int64_t batch = 8;  // global: sequences per step over all ranks
  int steps = 20;
  uint64_t seed = 0;
  Dtype dtype = Dtype::fp32;   // bf16: bf16 compute, fp32 reduction and master shards
  int threads = 0;             // intra-op threads per rank; 0: cores / local ranks
  double comm_timeout_s = 60;  // a collective waiting longer fails the run
  int tp = 1;                  // tensor parallelism (train_llama --tp): ranks splitting each matmul
  bool sp = false;             // sequence parallelism with it (train_llama --sp)
  int replicas = 1;  // hybrid sharding: model replicas, each sharded over world / replicas ranks
  bool reshard_after_forward = true;
  bool activation_checkpointing = false;
  bool init_full_model = false;  // build the whole model, then shard (default: block by block)

  // Optimizer: AdamW, weight decay on parameters of 2 or more dimensions only (not on norms and
  // biases), the learning rate warmed up linearly, then constant or cosine down to lr_min.
  OptimizerKind optimizer = OptimizerKind::fused_adamw;
  double lr = 3e-4;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 0.01;
  int warmup = 0;
  LrSchedule lr_schedule = LrSchedule::constant;
  double lr_min = 0;
  double clip_grad_norm = 0;     // > 0: clip gradients to this global 2-norm before each step
  int grad_accum = 1;            // micro-batches per step, the rank's batch split evenly
  bool grad_accum_sync = false;  // reduce-scatter after every micro-batch instead of once
  Nonfinite nonfinite = Nonfinite::stop;  // a NaN/inf loss or gradient norm
  // optimizer: AdamW's moments in host memory, the step on the CPU; all: FSDP2's
  // CPUOffloadPolicy (sharded parameters, gradients and optimizer state in host memory).
  Offload offload = Offload::none;
  // > 0: every unit's all-gather sends int8 weights with one scale per this many elements
  // (fsdp::quantized_all_gather, ZeRO++'s qwZ); 0: the compute dtype.
  int64_t quantize_all_gather = 0;
  // The head and the loss in one (fsdp/ops/linear_cross_entropy.h, Task::fused_loss): training
  // never holds the [tokens, vocabulary] logits; chunks of loss_chunk tokens (0: automatic).
  bool fused_loss = false;
  int64_t loss_chunk = 0;

  // Checkpoints and outputs.
  std::string save_dir;  // sharded checkpoints go here
  int save_every = 0;    // steps between checkpoints (0: only at the end)
  int keep = 0;          // checkpoints kept (0: all)
  bool resume = false;   // start from the latest checkpoint in save_dir
  std::string metrics_out;

  // Validation (a trainer that has validation data): every eval_every steps and at the end.
  int eval_every = 0;
  bool eval_only = false;  // evaluate the weights given and exit, no training
  int64_t eval_batch = 8;  // windows per forward

  // Profiling and memory.
  int profile_first = -1, profile_last = -1;  // --profile-steps A:B (inclusive); -1: off
  std::string profile_dir = "profile";
  bool profile_shapes = true;      // record operator shapes and FLOPs (scripts/roofline.py)
  bool track_host_memory = false;  // count CPU tensor bytes (host_tensor_peak_bytes per step)

  // --plan: print what a run with these flags needs (fsdp/tools/planner.h) instead of training.
  bool plan = false;
  int plan_world = 0;                    // the world to plan for (0: the launched one)
  int plan_ranks_per_host = 0;           // consecutive ranks per machine (0: one machine)
  std::string plan_collectives;          // collectives_bench --table CSV: measured times
  std::string plan_links = "350,45,20";  // busbw GB/s within, between hosts; latency us
  double plan_capacity_gib = 0;          // memory per rank; 0: not checked
  std::string plan_json;                 // write the plan as JSON here
  int plan_search = 0;                   // also print this many best layouts (dp x tp)
};

// The defaults that differ between trainers (the rest are TrainOptions' own).
struct TrainDefaults {
  double lr = 3e-4;
  double beta2 = 0.999;
  double weight_decay = 0.01;
  LrSchedule lr_schedule = LrSchedule::constant;
};

// Registers the loop's flags on `app`, writing into `o` (with `defaults` applied first), each in
// its section (sections.h): job, model (--dtype and the loss), parallelism and memory, optimizer
// and schedule, checkpoints, validation, profiling and planning. Sizes the trainer fills from
// presets (--seq, --batch, --steps) are the trainer's to register.
// `with_plan_flag` false leaves --plan out (fsdp_plan, which always plans).
void add_train_flags(CLI::App& app, TrainOptions& o, const TrainDefaults& defaults,
                     std::string& profile_steps, bool with_plan_flag = true);

// The flags of every program that runs a model, training or not (llama_generate too): [job]'s
// --seed, --threads, --comm-timeout and [model]'s --dtype.
void add_job_flags(CLI::App& app, TrainOptions& o);

// The planning section: --plan (when `with_plan_flag`) and --plan-*.
void add_plan_flags(CLI::App& app, TrainOptions& o, bool with_plan_flag);

// What `o.tp` needs of the world (--tp divides it): the error or "".
std::string check_job(const TrainOptions& o, int world);

// Parses argv (and the --recipe it names) into `app`'s flags, every one added in its section
// (add_section, sections.h), each option's value before parsing shown as its default in --help.
// nullopt when the program goes on; otherwise what to print and the exit code: --help's text
// and 0, or a parse error (with a pointer to --help) and 2.
struct ParseStop {
  int exit_code = 0;
  std::string message;
};
std::optional<ParseStop> parse_flags(CLI::App& app, int argc, char** argv);

// After parsing: reads --profile-steps and checks every value against the world size; the
// error (naming the flag, its value and what is expected) or "".
std::string finish_train_options(TrainOptions& o, const std::string& profile_steps, int world);

}  // namespace trainer
