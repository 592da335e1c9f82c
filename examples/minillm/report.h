// What train_minillm prints and writes: the run's header, one line (and one JSON metrics line)
// per step, and the summary. Everything collective (the loss averaged over ranks, the peak
// memory over ranks) happens here, after the step's clock stopped.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/models/minillm.h"
#include "options.h"

namespace minillm {

class Reporter {
 public:
  // Rank 0 prints; it also opens --metrics-out (InvalidArgument if it cannot).
  Reporter(const Options& options, const fsdp::Distributed& dist);

  // startup_peak_bytes: this rank's peak RSS once the model is built and sharded (collective:
  // every rank calls header).
  void header(int64_t n_params, int64_t shard_bytes, int64_t startup_peak_bytes,
              const std::string& data);
  // Around the timed part of a step: synchronises the GPU so the clock measures its work.
  void start_step(const fsdp::CommStats& comm);
  // grad_norm: the global gradient norm before clipping (0 when not clipping).
  void end_step(int step, const torch::Tensor& loss, double grad_norm, const fsdp::CommStats& comm,
                const fsdp::MemoryStats& memory);
  void summary();

 private:
  const Options& o_;
  const fsdp::Distributed& dist_;
  bool lead_, cuda_;
  std::ofstream metrics_;
  std::chrono::steady_clock::time_point t0_;
  double comm_before_ = 0;
  std::vector<double> step_times_, token_rates_;
  double first_loss_ = 0, last_loss_ = 0;
  int64_t peak_mem_ = 0;
};

}  // namespace minillm
