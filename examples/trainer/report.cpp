#include "report.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fsdp/io/files.h"

namespace trainer {
namespace {

// ": " and the system's reason when errno names one, else nothing.
std::string errno_suffix() { return errno ? std::string(": ") + std::strerror(errno) : ""; }

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The largest value of `x` over ranks (int64 travels as float64: exact below 2^53).
int64_t max_over_ranks(fsdp::ProcessGroup& pg, int64_t x, const c10::Device& device) {
  auto mine = torch::full({1}, static_cast<double>(x), torch::dtype(torch::kDouble).device(device));
  auto all = torch::empty({pg.size()}, mine.options());
  pg.all_gather(all, mine)->wait();
  return static_cast<int64_t>(all.max().item<double>());
}

}  // namespace

Reporter::Reporter(const TrainOptions& options, const fsdp::Distributed& dist, ModelInfo model)
    : o_(options),
      model_(std::move(model)),
      dist_(dist),
      lead_(dist.group->rank() == 0),
      cuda_(dist.device.is_cuda()) {}

namespace {

// The lines of an earlier run's --metrics-out that a run resumed at `start` keeps: its steps
// before `start` and its validations after at most `start` steps (the resumed run writes the
// others again). A line that is not JSON of ours stays.
std::string lines_before(const std::string& text, int start) {
  std::istringstream in(text);
  std::string line, kept;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer()) {
      const int64_t step = j["step"].get<int64_t>();
      if (j.contains("val_loss") ? step > start : step >= start) continue;
    }
    kept += line + "\n";
  }
  return kept;
}

}  // namespace

void Reporter::open_metrics(int start) {
  if (o_.metrics_out.empty()) return;
  // Agreed, so that every rank names it, instead of rank 0 leaving alone.
  fsdp::agree_on<fsdp::InvalidArgument>(*dist_.group, "--metrics-out", [&] {
    if (!lead_) return;
    auto mode = std::ios::out | std::ios::trunc;
    struct stat st {};
    const bool exists = ::stat(o_.metrics_out.c_str(), &st) == 0;
    if (start > 0 && exists) {
      mode = std::ios::out | std::ios::app;
      if (S_ISREG(st.st_mode)) {
        // A resumed run goes on with the record of the run it resumes, rewritten whole beside
        // the file a link names (then renamed over it) so that a crash leaves the old record or
        // the new one. Anything else (a pipe, /dev/stdout) is only appended to.
        char* real = ::realpath(o_.metrics_out.c_str(), nullptr);
        const std::string target = real ? real : o_.metrics_out;
        std::free(real);
        const std::string staged = fsdp::io::staging_path(target);
        try {
          fsdp::io::write_file(staged, lines_before(fsdp::io::read_file(target), start));
          fsdp::io::publish(staged, target);
        } catch (...) {
          ::unlink(staged.c_str());
          throw;
        }
      }
    } else if (!exists) {
      fsdp::io::make_directories(fsdp::io::parent_directory(o_.metrics_out));
    }
    errno = 0;
    metrics_.open(o_.metrics_out, mode);
    if (!metrics_) {
      throw fsdp::InvalidArgument(fmt::format("cannot write {}{}", o_.metrics_out, errno_suffix()));
    }
  });
}

void Reporter::write_metrics(const std::string& line, int step) {
  errno = 0;
  metrics_ << line << "\n";
  metrics_.flush();
  if (metrics_) return;
  // A full disk, a quota, a lost mount: the rest of the run would go unrecorded. Rank 0 alone
  // writes, so it leaves alone; the library ends the job at once (see docs/library.md).
  throw fsdp::IoError(
      fmt::format("writing --metrics-out {} failed after step {}{}; stopping the "
                  "run, whose record would be lost",
                  o_.metrics_out, step, errno_suffix()));
}

void Reporter::header(int64_t shard_bytes, int64_t trainable_shard_bytes,
                      int64_t startup_peak_bytes, const std::string& data) {
  const int64_t startup_peak = max_over_ranks(*dist_.group, startup_peak_bytes, dist_.device);
  if (!lead_) return;
  const int world = dist_.group->size();
  const std::string backend = dist_.group->backend_name();
  const int dp = world / o_.tp;
  std::string layout;
  if (o_.tp > 1) {
    layout = o_.replicas > 1 ? fmt::format(" as {} replicas x {} shards x tp {}", o_.replicas,
                                           dp / o_.replicas, o_.tp)
                             : fmt::format(" as dp {} x tp {}", dp, o_.tp);
    if (o_.sp) layout += " with sequence parallelism";
  } else if (o_.replicas > 1) {
    layout = fmt::format(" as {} replicas x {} shards (hybrid sharding)", o_.replicas,
                         world / o_.replicas);
  }
  fmt::print("{} | world {}{} | backend {}{} | device {} | dtype {}{}{}\n", model_.name, world,
             layout, backend, backend == "nccl" ? " " + fsdp::nccl_version() : "",
             dist_.device.str(), name(o_.dtype),
             o_.offload != Offload::none ? " | offload " + name(o_.offload) : "",
             o_.quantize_all_gather > 0
                 ? fmt::format(" | int8 all-gather, blocks of {}", o_.quantize_all_gather)
                 : "");
  fmt::print("model: {} seq {} | {:.2f}M parameters ({:.1f} MiB fp32)\n", model_.sizes, o_.seq,
             model_.parameters / 1e6, mib(model_.parameters * 4));
  // Frozen parameters (LoRA's base weights) have neither gradients nor optimizer state.
  fmt::print(
      "per rank: parameter shards {:.1f} MiB, + gradients and AdamW state about {:.1f} MiB more "
      "({}ZeRO-3: 16 bytes/param / {})\n",
      mib(shard_bytes), mib(3 * trainable_shard_bytes),
      trainable_shard_bytes < shard_bytes
          ? fmt::format("{:.1f} MiB of the shards trainable; ", mib(trainable_shard_bytes))
          : "",
      o_.tp > 1 ? fmt::format("(tp {} x {} shards)", o_.tp, dp / o_.replicas)
                : fmt::format("{}", world / o_.replicas));
  fmt::print("start-up: {} | peak rss {:.0f} MiB/rank once built and sharded\n",
             o_.init_full_model ? "whole model, then sharded" : "each block sharded as it is built",
             mib(startup_peak));
  fmt::print("data: {} | global batch {} sequences ({} per {}rank{}) | {} steps{}\n", data,
             o_.batch, o_.batch / dp, o_.tp > 1 ? "data-parallel " : "",
             o_.grad_accum > 1 ? fmt::format(" in {} micro-batches{}", o_.grad_accum,
                                             o_.grad_accum_sync ? ", reduced each" : "")
                               : "",
             o_.steps, o_.activation_checkpointing ? " | activation checkpointing" : "");
}

void Reporter::start_step(const fsdp::CommStats& comm) {
  comm_before_ = comm.exposed_seconds;
  if (cuda_) torch::cuda::synchronize();
  fsdp::reset_host_tensor_peak();  // --track-host-memory: this step's peak
  t0_ = std::chrono::steady_clock::now();
}

void Reporter::end_step(int step, const torch::Tensor& loss, double grad_norm, double lr,
                        const fsdp::CommStats& comm, const fsdp::MemoryStats& m) {
  if (cuda_) torch::cuda::synchronize();
  const double step_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const double exposed = comm.exposed_seconds - comm_before_;
  auto& pg = *dist_.group;
  auto global_loss = loss.detach().reshape({1}).clone();
  pg.all_reduce(global_loss, fsdp::ReduceOp::kAvg)->wait();
  const int64_t mem =
      cuda_ ? fsdp::cuda_peak_allocated_bytes(dist_.device.index()) : fsdp::host_peak_rss_bytes();
  peak_mem_ = max_over_ranks(pg, mem, dist_.device);
  const double loss_value = global_loss.item<double>();
  const double tokens_per_s = o_.batch * o_.seq / step_s;
  if (step_times_.empty()) first_loss_ = loss_value;  // the first step run (resumed: not 0)
  last_loss_ = loss_value;
  step_times_.push_back(step_s);
  token_rates_.push_back(tokens_per_s);
  if (!lead_) return;
  fmt::print(
      "step {:>4} | loss {:.4f}{} | {:>8.0f} tok/s | step {:.3f} s (compute {:.3f}, exposed comm "
      "{:.3f}) | peak {} {:.0f} MiB/rank | full params peak {:.1f} MiB\n",
      step, loss_value, o_.clip_grad_norm > 0 ? fmt::format(" | grad norm {:.3f}", grad_norm) : "",
      tokens_per_s, step_s, step_s - exposed, exposed, cuda_ ? "allocated" : "rss", mib(peak_mem_),
      mib(m.tree.peak_full_param_bytes));
  std::fflush(stdout);
  if (metrics_.is_open()) {
    nlohmann::json j = {{"step", step},
                        {"loss", loss_value},
                        {"lr", lr},
                        {"tokens_per_s", tokens_per_s},
                        {"step_s", step_s},
                        {"compute_s", step_s - exposed},
                        {"exposed_comm_s", exposed},
                        {"peak_mem_bytes", peak_mem_},
                        {"peak_full_param_bytes", m.tree.peak_full_param_bytes},
                        {"sharded_param_bytes", m.sharded_param_bytes},
                        {"sharded_grad_bytes", m.sharded_grad_bytes},
                        {"peak_comm_buffer_bytes", m.tree.peak_comm_buffer_bytes},
                        {"world", pg.size()}};
    if (o_.clip_grad_norm > 0) j["grad_norm"] = grad_norm;
    // This rank's (rank 0's: the most rows) CPU tensor peak of the step, all tensors counted.
    if (auto host = fsdp::host_tensor_memory(); host.tracking) {
      j["host_tensor_peak_bytes"] = host.peak;
    }
    write_metrics(j.dump(), step);
  }
}

void Reporter::validation(int steps_done, double val_loss, int64_t windows) {
  if (!lead_) return;
  fmt::print("validation after {} steps | val_loss {:.9g} | {} windows of {} tokens\n", steps_done,
             val_loss, windows, o_.seq);
  std::fflush(stdout);
  if (metrics_.is_open()) {
    write_metrics(
        nlohmann::json{{"step", steps_done}, {"val_loss", val_loss}, {"windows", windows}}.dump(),
        steps_done);
  }
}

void Reporter::summary() {
  if (!lead_) return;
  // The first steps warm up allocators and caches: medians skip them when there are enough.
  const size_t skip = step_times_.size() > 4 ? 2 : 0;
  std::vector<double> rates(token_rates_.begin() + skip, token_rates_.end());
  std::vector<double> times(step_times_.begin() + skip, step_times_.end());
  const double tps = median(rates);
  fmt::print(
      "done: loss {:.4f} -> {:.4f} | median {:.0f} tok/s, {:.3f} s/step | peak {:.0f} "
      "MiB/rank\n",
      first_loss_, last_loss_, tps, median(times), mib(peak_mem_));
  if (cuda_ && model_.flops_per_token > 0) {
    double mfu = tps / dist_.group->size() * model_.flops_per_token / 989e12;
    fmt::print("MFU {:.1f}% of 989 TFLOP/s dense bf16 per GPU\n", 100 * mfu);
  }
}

}  // namespace trainer
