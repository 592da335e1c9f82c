#include "loop.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "fsdp/comm/agree.h"
#include "fsdp/errors.h"
#include "fsdp/io/files.h"
#include "fsdp/ops/float8.h"
#include "optimizer.h"
#include "output_paths.h"

namespace trainer {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The flags set AdamW's betas, eps and weight decay on a resumed run too, as they set its
// learning rate (a run may change them where it resumes; a checkpoint's would otherwise win
// silently). Restores `flagged` (each group's options before the load) and returns what
// differed from the checkpoint's ("weight decay 0.5 (saved: 0.01), ..."), or "".
std::string keep_flagged_settings(torch::optim::Optimizer& opt,
                                  const std::vector<torch::optim::AdamWOptions>& flagged) {
  std::vector<std::string> changes;
  auto note = [&](const char* what, double now, double saved) {
    const auto line = fmt::format("{} {} (saved: {})", what, now, saved);
    if (now != saved && std::find(changes.begin(), changes.end(), line) == changes.end()) {
      changes.push_back(line);
    }
  };
  auto& groups = opt.param_groups();
  for (size_t i = 0; i < groups.size() && i < flagged.size(); ++i) {
    auto& loaded = static_cast<torch::optim::AdamWOptions&>(groups[i].options());
    const auto& want = flagged[i];
    note("beta1", std::get<0>(want.betas()), std::get<0>(loaded.betas()));
    note("beta2", std::get<1>(want.betas()), std::get<1>(loaded.betas()));
    note("eps", want.eps(), loaded.eps());
    note("weight decay", want.weight_decay(), loaded.weight_decay());
    loaded.betas(want.betas()).eps(want.eps()).weight_decay(want.weight_decay());
  }
  return fmt::format("{}", fmt::join(changes, ", "));
}

// --resume: the step to start from (0 without a checkpoint), with model and optimizer loaded.
int resume(const TrainOptions& o, Task& task, torch::optim::Optimizer& opt,
           const fsdp::Distributed& dist) {
  if (!o.resume) return 0;
  auto latest = fsdp::latest_checkpoint(o.save_dir);
  const bool lead = dist.group->rank() == 0;
  if (!latest) {
    if (lead) fmt::print("resume: no checkpoint in {}; starting at step 0\n", o.save_dir);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  fsdp::LoadOptions options;
  options.tp = task.tp;
  options.filter = task.checkpoint_filter;
  // AdamW's settings as this run's flags made them: the load sets the checkpoint's.
  std::vector<torch::optim::AdamWOptions> flagged;
  for (auto& group : opt.param_groups()) {
    flagged.push_back(static_cast<torch::optim::AdamWOptions&>(group.options()));
  }
  auto info = fsdp::load_checkpoint(*latest, *task.module, &opt, dist.group, options);
  const std::string changed = keep_flagged_settings(opt, flagged);
  // After the load (collective; the same verdict on every rank): nothing is written, and the
  // run stops before its first step.
  const auto& id = task.checkpoint_identity;
  if (!id.key.empty()) {
    auto it = info.metadata.find(id.key);
    if (it != info.metadata.end() && it->second != id.value) {
      auto what = info.metadata.find(id.key + ".what");
      throw fsdp::InvalidArgument(fmt::format(
          "resume: {} was trained on another {}: {} ({}), this run has {} ({}); resume with "
          "the one it was trained on",
          info.path, id.key, what == info.metadata.end() ? "?" : what->second, it->second, id.what,
          id.value));
    }
  }
  if (lead) {
    fmt::print("resume: {} (step {}, saved by {} ranks{}) loaded in {:.2f} s\n", info.path,
               info.step, info.world_size, info.partial ? ", trainable parameters only" : "",
               seconds_since(t0));
    if (!changed.empty()) {
      fmt::print("resume: AdamW's {} as the flags say, not as the checkpoint saved them\n",
                 changed);
    }
  }
  return static_cast<int>(info.step);
}

// A checkpoint after `steps_done` steps.
void save(const TrainOptions& o, int steps_done, Task& task, const torch::optim::Optimizer& opt,
          const fsdp::Distributed& dist) {
  const auto t0 = std::chrono::steady_clock::now();
  fsdp::SaveOptions options;
  options.keep_last = o.keep;
  options.metadata["data_step"] = std::to_string(steps_done);
  if (!task.checkpoint_identity.key.empty()) {
    options.metadata[task.checkpoint_identity.key] = task.checkpoint_identity.value;
    options.metadata[task.checkpoint_identity.key + ".what"] = task.checkpoint_identity.what;
  }
  options.tp = task.tp;
  options.filter = task.checkpoint_filter;
  auto path =
      fsdp::save_checkpoint(o.save_dir, steps_done, *task.module, &opt, dist.group, options);
  if (dist.group->rank() == 0) fmt::print("saved {} in {:.2f} s\n", path, seconds_since(t0));
}

// The counters of the world group, and of the shard, replicate and tensor-parallel groups when
// the mesh has them apart from the world, by name.
std::vector<std::pair<std::string, fsdp::CollectiveStats>> group_stats(
    const fsdp::DeviceMesh& mesh) {
  std::vector<std::pair<std::string, fsdp::CollectiveStats>> out{
      {"the process group", mesh.world->stats()}};
  if (mesh.shard != mesh.world) out.emplace_back("the shard group", mesh.shard->stats());
  if (mesh.replicate) out.emplace_back("the replicate group", mesh.replicate->stats());
  if (mesh.tp) out.emplace_back("the tensor-parallel group", mesh.tp->stats());
  return out;
}

std::string trace_path(const TrainOptions& o, int rank) {
  return fmt::format("{}/rank{}.json", o.profile_dir, rank);
}

// End of --profile-steps: each rank writes its trace; rank 0 prints the operator table and
// the communication figures read from its trace, beside the trainer's own exposed time.
void report_profile(const TrainOptions& o, const fsdp::Distributed& dist,
                    const fsdp::DeviceMesh& mesh, double trainer_exposed_s,
                    const std::vector<std::pair<std::string, fsdp::CollectiveStats>>& before,
                    fsdp::ProfilingScope& profiling, int first) {
  const int rank = dist.group->rank();
  const auto after = group_stats(mesh);
  const std::string path = trace_path(o, rank);
  auto summary = profiling.stop(path);
  if (rank != 0) return;
  fmt::print("profile: steps {}..{} -> {}/rank*.json (open in https://ui.perfetto.dev)\n{}", first,
             o.profile_last, o.profile_dir, fsdp::format_op_table(summary));
  if (dist.device.is_cuda()) {
    // On CUDA the trace's host ranges time only the launches (the host's wait() returns at
    // once); the exposed time is the compute stream's stalls on the collectives' events, which
    // only the trainer counts. The kernels' times are in the trace's GPU rows.
    fmt::print(
        "profile: exposed communication (the compute stream waiting on collectives, CUDA "
        "events) {:.1f} ms; the host ranges time launches only: read the trace's GPU rows\n",
        1e3 * trainer_exposed_s);
  } else {
    fmt::print(
        "profile: compute {:.1f} ms on the training thread, communication {:.1f} ms on the comm "
        "thread, exposed (training thread waiting) {:.1f} ms (the trainer's own count: {:.1f} "
        "ms), overlap {:.0f}%\n",
        summary.compute_ms, summary.comm_ms, summary.exposed_comm_ms, 1e3 * trainer_exposed_s,
        100 * summary.overlap);
  }
  for (size_t g = 0; g < after.size(); ++g) {
    auto issued = [&](fsdp::CollectiveKind k) {
      return after[g].second.count(k) - before[g].second.count(k);
    };
    fmt::print("profile: {} issued {} all-gathers, {} reduce-scatters, {} all-reduces\n",
               after[g].first, issued(fsdp::CollectiveKind::kAllGather),
               issued(fsdp::CollectiveKind::kReduceScatter),
               issued(fsdp::CollectiveKind::kAllReduce));
    auto sent = [&](fsdp::CollectiveKind k) {
      return static_cast<double>(after[g].second.bytes_of(k) - before[g].second.bytes_of(k)) /
             (1 << 20);
    };
    // Input bytes, what the engine counts: a reduce-scatter's input is the world's gradients.
    fmt::print(
        "profile: {} collective inputs per rank: all-gathers {:.2f} MiB, reduce-scatters "
        "{:.2f} MiB, all-reduces {:.2f} MiB\n",
        after[g].first, sent(fsdp::CollectiveKind::kAllGather),
        sent(fsdp::CollectiveKind::kReduceScatter), sent(fsdp::CollectiveKind::kAllReduce));
  }
  fmt::print("profile: waits per unit (training thread)\n{}", fsdp::format_unit_waits(summary));
  if (o.profile_shapes) {
    fmt::print("profile: roofline: scripts/roofline.py {} --steps {}\n", path,
               o.profile_last - first + 1);
  }
}

// Whether every rank's loss and the global gradient norm are finite (one all-reduce of the loss
// sum: a NaN or infinity on any rank reaches every rank).
bool finite_step(const torch::Tensor& loss, double grad_norm, const fsdp::Distributed& dist) {
  auto sum = loss.detach().to(torch::kDouble).reshape({1}).clone();
  dist.group->all_reduce(sum, fsdp::ReduceOp::kSum)->wait();
  return std::isfinite(grad_norm) && std::isfinite(sum.item<double>());
}

// One step's forward and backward over o.grad_accum micro-batches: gradients accumulate
// unsharded and are reduced with the last (or after each with --grad-accum-sync); each loss is
// scaled so that their sum is the mean over the rank's batch: by 1 / grad_accum, or with a loss
// mask by the micro-batch's share of the batch's counted targets (a mean over every counted
// target of the batch, whatever the split: not a mean of micro-batch means). Returns the loss
// summed over micro-batches.
torch::Tensor forward_backward(const TrainOptions& o, Task& task, const Batch& batch,
                               const c10::Device& device) {
  const int64_t micro = batch.tokens.size(0) / o.grad_accum;
  auto loss_sum = torch::zeros({}, torch::dtype(torch::kFloat).device(device));
  // Counted on the batch as it comes (on the host): no device sync.
  const int64_t counted = task.masked_targets ? (batch.targets != -100).sum().item<int64_t>() : 0;
  for (int k = 0; k < o.grad_accum; ++k) {
    task.root.set_requires_gradient_sync(o.grad_accum_sync || k + 1 == o.grad_accum);
    auto tokens = batch.tokens.narrow(0, k * micro, micro).to(device);
    const auto host_targets = batch.targets.narrow(0, k * micro, micro);
    auto targets = host_targets.to(device);
    // The mean over the counted targets (-100: not counted, as transformers' labels); none
    // counted: zero, through the model so that the backward's collectives still run (the fused
    // loss is zero, with zero gradients, by itself then).
    const int64_t here = task.masked_targets ? (host_targets != -100).sum().item<int64_t>() : 1;
    torch::Tensor mean;
    if (task.fused_loss) {
      mean = task.fused_loss(tokens, targets);
    } else {
      auto logits = task.logits(tokens);
      mean = here == 0 ? logits.sum() * 0
             : task.loss
                 ? task.loss(logits, targets)
                 : torch::nn::functional::cross_entropy(
                       logits.reshape({-1, task.vocab}).to(torch::kFloat), targets.reshape(-1));
    }
    auto loss = task.masked_targets ? mean * (static_cast<double>(here) /
                                              static_cast<double>(std::max<int64_t>(counted, 1)))
                                    : mean / o.grad_accum;
    loss.backward();
    loss_sum += loss.detach();
  }
  return loss_sum;
}

// The gradient norm the step needs: clipped (--clip-grad-norm), or only measured for the
// non-finite guard; 0 when neither.
double grad_norm_of(const TrainOptions& o, Task& task) {
  // Under tensor parallelism the norm spans the TP slices too, the same on every rank (a
  // verdict that differed between TP ranks would desynchronise them).
  if (task.tp.active()) {
    if (o.clip_grad_norm > 0) return fsdp::clip_grad_norm_(task.root, o.clip_grad_norm, task.tp);
    if (o.nonfinite != Nonfinite::off) return fsdp::total_grad_norm(task.root, task.tp);
    return 0;
  }
  if (o.clip_grad_norm > 0) return fsdp::clip_grad_norm_(task.root, o.clip_grad_norm);
  if (o.nonfinite != Nonfinite::off) return fsdp::total_grad_norm(task.root);
  return 0;
}

// The bytes of the trainable parameters (a parameter shared by two modules once): LoRA's
// frozen base weights have neither gradients nor optimizer state.
int64_t trainable_bytes(const torch::nn::Module& module) {
  int64_t bytes = 0;
  std::unordered_set<const void*> counted;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad() && counted.insert(p.unsafeGetTensorImpl()).second) {
      bytes += static_cast<int64_t>(p.nbytes());
    }
  }
  return bytes;
}

// The optimizer step, unless --nonfinite finds the loss or the gradient norm not finite: then
// it stops (throws) or skips the step, counted in `skipped`. The same verdict on every rank:
// the norm and the loss sum are global.
void step_unless_nonfinite(const TrainOptions& o, torch::optim::Optimizer& opt,
                           const torch::Tensor& loss_sum, double grad_norm,
                           const fsdp::Distributed& dist, int step, int& skipped) {
  if (o.nonfinite != Nonfinite::off && !finite_step(loss_sum, grad_norm, dist)) {
    if (o.nonfinite == Nonfinite::stop) {
      throw fsdp::Error(fmt::format(
          "step {}: the loss or the gradient norm is not finite (gradient norm {}); stopped "
          "before the optimizer step (--nonfinite skip skips such steps instead)",
          step, grad_norm));
    }
    ++skipped;
    if (dist.group->rank() == 0) {
      fmt::print(
          "step {}: the loss or the gradient norm is not finite (gradient norm {}); "
          "optimizer step skipped ({} so far)\n",
          step, grad_norm, skipped);
    }
    return;
  }
  // Named so that a trace (and scripts/roofline.py) can tell the optimizer's ops apart.
  RECORD_USER_SCOPE("optimizer_step");
  opt.step();
}

// --profile-steps A:B: the profiler from step A's start to step B's end, and the communication
// figures of those steps.
struct ProfileWindow {
  int first = -1;
  double comm_before = 0;
  std::vector<std::pair<std::string, fsdp::CollectiveStats>> stats_before;

  // Before the first step, on every rank alike: --profile-dir made, and a file can be written
  // there (the traces come only at the window's end: a directory that cannot take them should
  // not cost the steps before it).
  static void prepare(const TrainOptions& o, const fsdp::Distributed& dist) {
    if (o.profile_first < 0) return;
    fsdp::agree_on<fsdp::InvalidArgument>(*dist.group, "--profile-dir", [&] {
      try {
        fsdp::io::make_directories(o.profile_dir);  // not std::filesystem: see fsdp/io/files.h
      } catch (const fsdp::IoError& e) {
        throw fsdp::InvalidArgument(e.what());
      }
      // A file of its own, so that a trace of an earlier run stays until this one replaces it.
      const std::string probe =
          fmt::format("{}/.rank{}.probe-{}", o.profile_dir, dist.group->rank(), ::getpid());
      const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) {
        throw fsdp::InvalidArgument(
            fmt::format("cannot write in {}: {}", o.profile_dir, std::strerror(errno)));
      }
      ::close(fd);
      ::unlink(probe.c_str());
    });
  }

  // The window starts at the first of its steps this run takes: A, or the step a --resume
  // starts from inside it.
  void before_step(int step, const TrainOptions& o, Task& task, const fsdp::DeviceMesh& mesh) {
    if (profiling || step < o.profile_first || step > o.profile_last) return;
    first = step;
    comm_before = task.root.comm_stats().exposed_seconds;
    stats_before = group_stats(mesh);
    profiling.emplace(fsdp::ProfileOptions{o.profile_shapes});
  }
  void after_step(int step, const TrainOptions& o, Task& task, const fsdp::Distributed& dist,
                  const fsdp::DeviceMesh& mesh) {
    if (step != o.profile_last || !profiling) return;
    report_profile(o, dist, mesh, task.root.comm_stats().exposed_seconds - comm_before,
                   stats_before, *profiling, first);
  }

  // Stops the profiler if an error leaves the window early (see ProfilingScope).
  std::optional<fsdp::ProfilingScope> profiling;
};

}  // namespace

int run_training(const TrainOptions& o, Task& task, const fsdp::Distributed& dist,
                 const fsdp::DeviceMesh& mesh) {
  // Each data-parallel rank its part of the batch; the TP ranks of one share it.
  const DataShare share{mesh.dp_index(), mesh.dp_size()};
  const int64_t local_batch = o.batch / share.count;
  const int64_t startup_peak = fsdp::host_peak_rss_bytes();
  auto opt = make_optimizer(o, *task.module);
  if (o.quantize_all_gather > 0) {
    task.root.set_custom_all_gather(fsdp::quantized_all_gather({o.quantize_all_gather}),
                                    /*recurse=*/true);
  }
  Reporter report(o, dist, task.info);
  report.header(task.root.memory_stats().sharded_param_bytes, trainable_bytes(*task.module),
                startup_peak, task.train ? task.train->describe() : "none");
  auto validate = [&](int steps_done) {
    if (!task.validation) return;
    // Evaluation mode (dropout off, as transformers' model.eval()), training mode after.
    task.module->eval();
    const double loss = validation_loss(*task.validation, task.logits, task.vocab, o.eval_batch,
                                        *dist.group, dist.device, task.loss, share);
    task.module->train();
    report.validation(steps_done, loss, task.validation->count());
  };

  const int start = resume(o, task, *opt, dist);
  report.open_metrics(start);
  if (o.eval_only) {
    validate(start);
    return 0;
  }
  ProfileWindow::prepare(o, dist);
  ProfileWindow profile;
  int skipped = 0;  // steps skipped by --nonfinite skip
  for (int step = start; step < o.steps; ++step) {
    auto batch = task.train->slice(step, share.index * local_batch, local_batch);
    profile.before_step(step, o, task, mesh);
    const double lr = lr_at(o, step);
    set_lr(*opt, lr);
    report.start_step(task.root.comm_stats());
    opt->zero_grad();
    auto loss_sum = forward_backward(o, task, batch, dist.device);
    const double grad_norm = grad_norm_of(o, task);
    step_unless_nonfinite(o, *opt, loss_sum, grad_norm, dist, step, skipped);
    report.end_step(step, loss_sum, grad_norm, lr, task.root.comm_stats(),
                    task.root.memory_stats());
    profile.after_step(step, o, task, dist, mesh);
    const int done = step + 1;
    const bool last = done == o.steps;
    if (!o.save_dir.empty() && ((o.save_every > 0 && done % o.save_every == 0) || last)) {
      save(o, done, task, *opt, dist);
    }
    if ((o.eval_every > 0 && done % o.eval_every == 0 && !last) || last) validate(done);
  }
  if (start >= o.steps && dist.group->rank() == 0) {
    // A checkpoint at or past the last step: the weights are final (the exports still come).
    fmt::print("resume: the checkpoint is at step {}, --steps {}: nothing left to train\n", start,
               o.steps);
  }
  if (task.finish) task.finish();
  if (start < o.steps) report.summary();
  if (skipped > 0 && dist.group->rank() == 0) {
    fmt::print("skipped {} of {} optimizer steps: the loss or the gradients were not finite\n",
               skipped, o.steps - start);
  }
  return 0;
}

std::string without_backtrace(const std::string& message) {
  const char* show = std::getenv("TORCH_SHOW_CPP_STACKTRACES");
  if (show != nullptr && std::string(show) == "1") return message;
  // libtorch's c10::Error text, also inside the messages that quote it: a line "frame #N: ..."
  // per frame, after "Exception raised from F at FILE:LINE (most recent call first):" or not.
  std::istringstream in(message);
  std::string line, out;
  while (std::getline(in, line)) {
    if (line.rfind("frame #", 0) == 0 || line.rfind("Exception raised from ", 0) == 0) continue;
    if (!out.empty()) out += '\n';
    out += line;
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

int trainer_main(int argc, char** argv,
                 const std::function<Parsed(int argc, char** argv, int world)>& parse,
                 const std::function<int()>& plan,
                 const std::function<int(const fsdp::LaunchInfo&)>& run) {
  // The launch is read once: its world size validates the flags before any communication.
  fsdp::LaunchInfo launch;
  try {
    launch = fsdp::detect_launch();
  } catch (const fsdp::LaunchError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  // Every rank parses the same arguments and reaches the same verdict, so all exit before any
  // communication starts; only rank 0 prints it. A check that reads a file the flags name (a
  // config.json) may throw: bad input too.
  set_output_rank(launch.rank);
  Parsed parsed;
  try {
    parsed = parse(argc, argv, launch.world_size);
  } catch (const std::exception& e) {
    if (launch.rank == 0) fmt::print(stderr, "error: {}\n", without_backtrace(e.what()));
    return 2;
  }
  if (!parsed.run) {
    if (launch.rank == 0) (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  if (launch.rank == 0 && !parsed.notice.empty()) std::cerr << parsed.notice << std::flush;
  // The planner needs no communication: one process describes any world.
  if (parsed.plan) return launch.rank == 0 ? plan() : 0;
  if (parsed.track_host_memory) fsdp::track_host_tensor_memory();
  try {
    return run(launch);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[rank {}/{}] error: {}\n", launch.rank, launch.world_size,
               without_backtrace(e.what()));
    return 1;
  }
}

int threads_for(int threads) {
  if (threads > 0) return threads;
  // OMP_NUM_THREADS, when set, is what PyTorch and every OpenMP program honour: a user who sets
  // it (the benchmarks do) gets that many, not the machine's share.
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    const int n = std::atoi(omp);
    if (n > 0) return n;
  }
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!local) local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
}

void check_float8_device(bool float8, fsdp::ops::Float8Scaling scaling,
                         const fsdp::Distributed& dist) {
  if (!float8) return;
  fsdp::agree_on<fsdp::UnsupportedError>(*dist.group, "--float8", [&] {
    if (const auto why = fsdp::ops::float8_unsupported_on(dist.device, scaling); !why.empty()) {
      throw fsdp::UnsupportedError(why);
    }
  });
}

fsdp::Distributed start_job(const TrainOptions& o, const fsdp::LaunchInfo& launch) {
  torch::set_num_threads(threads_for(o.threads));
  fsdp::InitOptions init;
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.comm_timeout_s * 1000));
  return fsdp::init_from_launch(launch, init);
}

}  // namespace trainer
