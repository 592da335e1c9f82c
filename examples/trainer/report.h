// What a trainer prints and writes: the run's header, one line (and one JSON metrics line)
// per step and per validation, and the summary. Everything collective (the loss averaged over
// ranks, the peak memory over ranks) happens here, after the step's clock stopped.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "train_options.h"

namespace trainer {

// What the header says about the model.
struct ModelInfo {
  std::string name;            // "MiniLLM", "Llama"
  std::string sizes;           // "vocab 32000 dim 256 layers 4 heads 8"
  int64_t parameters = 0;      // each tensor once
  double flops_per_token = 0;  // training FLOPs per token (MFU on GPUs)
};

class Reporter {
 public:
  // Rank 0 prints, and writes --metrics-out once open_metrics opened it. A write that fails (a
  // full disk) throws IoError on rank 0.
  Reporter(const TrainOptions& options, const fsdp::Distributed& dist, ModelInfo model);

  // Collective, once the run knows its first step (after --resume): opens --metrics-out on rank
  // 0 (its directory made if missing), InvalidArgument on every rank if it cannot. A run from
  // step 0 replaces the file; a run resumed at `start` keeps the earlier run's lines before
  // `start` in a regular file (a link's target) and appends; other files are appended to.
  void open_metrics(int start);

  // startup_peak_bytes: this rank's peak RSS once the model is built and sharded (collective:
  // every rank calls header).
  // trainable_shard_bytes: the shards of parameters that take a gradient (all, unless some are
  // frozen).
  void header(int64_t shard_bytes, int64_t trainable_shard_bytes, int64_t startup_peak_bytes,
              const std::string& data);
  // Around the timed part of a step: synchronises the GPU so the clock measures its work.
  void start_step(const fsdp::CommStats& comm);
  // grad_norm: the global gradient norm before clipping (0 when not clipping).
  void end_step(int step, const torch::Tensor& loss, double grad_norm, double lr,
                const fsdp::CommStats& comm, const fsdp::MemoryStats& memory);
  // After `steps_done` steps (printed and written by rank 0; the value is every rank's).
  void validation(int steps_done, double val_loss, int64_t windows);
  void summary();

 private:
  // One JSON line to --metrics-out, flushed; IoError naming the file and `step` if it fails.
  void write_metrics(const std::string& line, int step);

  const TrainOptions& o_;
  ModelInfo model_;
  const fsdp::Distributed& dist_;
  bool lead_, cuda_;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point t0_;
  double comm_before_ = 0;
  std::vector<double> step_times_, token_rates_;
  double first_loss_ = 0, last_loss_ = 0;
  int64_t peak_mem_ = 0;
};

}  // namespace trainer
