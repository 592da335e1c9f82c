// The training loop every trainer runs (train_minillm, train_llama): resume, steps of
// micro-batches with the loss averaged, clipping, the non-finite guard, the learning-rate
// schedule, validation, checkpoints and profiling. The model and the data are the trainer's.
#pragma once

#include <functional>
#include <string>

#include "data.h"
#include "evaluate.h"
#include "fsdp/fsdp.h"
#include "fsdp/ops/float8_scaling.h"
#include "report.h"
#include "train_options.h"

namespace trainer {

struct Task {
  fsdp::FSDPModule root;      // the sharded model's root unit
  torch::nn::Module* module;  // its module: state dicts, checkpoints
  LogitsFn logits;            // tokens [B, L] -> logits [B, L, vocab], through the root
  LossFn loss;                // the model's loss over those logits; null: cross-entropy
  // Training's loss of targets [B, L] for tokens [B, L] straight from the tokens, the head and
  // the loss fused (the mean over counted targets, 0 when none: as `loss` of `logits`); null:
  // loss(logits(tokens)). Validation still goes through `logits`.
  std::function<torch::Tensor(const torch::Tensor& tokens, const torch::Tensor& targets)>
      fused_loss;
  int64_t vocab = 0;
  // Tensor parallelism: which parameters hold slices, for the global gradient norm and for
  // checkpoints of the full tensors (empty: none).
  fsdp::tp::Layout tp;
  // The tensors checkpoints hold (SaveOptions/LoadOptions::filter); empty: all. LoRA: the
  // adapters, the frozen weights being the base model's.
  std::function<bool(const std::string&)> checkpoint_filter;
  // What a checkpoint must have been trained with to resume (LoRA: the frozen base model, which
  // a partial checkpoint does not hold): `key` = `value` is written into every checkpoint's
  // metadata with `what` (for messages) as `key`.what; a resume from a checkpoint with another
  // value is refused by name. Empty key: none.
  struct Identity {
    std::string key, value, what;
  };
  Identity checkpoint_identity;
  const Dataset* train = nullptr;
  // The training targets hold -100 where a loss mask leaves a token out: a micro-batch with no
  // counted target then adds a zero loss (cross_entropy's mean over none would be NaN).
  bool masked_targets = false;
  const Windows* validation = nullptr;  // null: no validation
  ModelInfo info;
  // After training (and the last checkpoint): exports, for example. Collective.
  std::function<void()> finish;
};

// Runs `task` under `o` (the world is dist's, hybrid as o.replicas says); returns the exit
// code. Throws what the library throws; the caller prints it.
int run_training(const TrainOptions& o, Task& task, const fsdp::Distributed& dist,
                 const fsdp::DeviceMesh& mesh);

// The main of a trainer: reads the launch, parses (every rank reaches the same verdict, rank 0
// prints it), runs --plan without communication, else `run` (errors printed with the rank).
// `parse` returns the exit code and message when there is nothing to run.
// `message` without the C++ backtrace libtorch's errors carry (c10::Error's "Exception raised
// from ..." and its "frame #N" lines, also where another message quotes one): what a user reads.
// TORCH_SHOW_CPP_STACKTRACES=1 keeps it.
std::string without_backtrace(const std::string& message);

struct Parsed {
  bool run = false;
  int exit_code = 0;
  std::string message;
  bool plan = false;
  bool track_host_memory = false;
  std::string notice;  // deprecation lines: rank 0 prints them on stderr before it goes on
};
int trainer_main(int argc, char** argv,
                 const std::function<Parsed(int argc, char** argv, int world)>& parse,
                 const std::function<int()>& plan,
                 const std::function<int(const fsdp::LaunchInfo&)>& run);

// A trainer's own parse function (argc, argv, world) -> {std::optional<Options> options,
// exit_code, message}, with the loop's flags in Options::train, as trainer_main's `parse`:
// the options parsed land in `options`.
template <class Options, class Parse>
std::function<Parsed(int, char**, int)> parse_into(Options& options, Parse parse) {
  return [&options, parse](int argc, char** argv, int world) {
    auto parsed = parse(argc, argv, world);
    Parsed out;
    out.run = parsed.options.has_value();
    out.exit_code = parsed.exit_code;
    out.message = parsed.message;
    out.notice = parsed.notice;
    if (parsed.options) {
      options = *parsed.options;
      out.plan = options.train.plan;
      out.track_host_memory = options.train.track_host_memory;
    }
    return out;
  };
}

// Intra-op threads per rank: --threads, else OMP_NUM_THREADS when set (as PyTorch reads it),
// else the cores over the ranks on this machine.
int threads_for(int threads);

// The job's start, as --threads and --comm-timeout say: the intra-op threads, then the process
// group of the launch (its rendezvous and collectives bounded by the timeout).
fsdp::Distributed start_job(const TrainOptions& o, const fsdp::LaunchInfo& launch);

// With --float8 (`float8`), throws fsdp::UnsupportedError on every rank when a rank's device
// cannot run float8 GEMMs of `scaling`'s recipe (fsdp::ops::float8_unsupported_on: a GPU before
// compute capability 8.9, say), naming the ranks: called by every rank before the model is built
// (collective with --float8: in a job of mixed GPUs no rank is left waiting for the others).
void check_float8_device(bool float8, fsdp::ops::Float8Scaling scaling,
                         const fsdp::Distributed& dist);

}  // namespace trainer
