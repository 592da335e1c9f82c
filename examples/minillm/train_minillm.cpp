// train_minillm: the MiniLLM example trainer. Every block is a fully_shard unit, then the root;
// AdamW over the shards; a plain training loop. See README.md beside this file.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <iostream>
#include <thread>

#include "data.h"
#include "fsdp/fsdp.h"
#include "fsdp/models/minillm.h"
#include "options.h"
#include "plan_command.h"
#include "report.h"

namespace {

using minillm::Options;

std::unique_ptr<minillm::Dataset> open_data(const Options& o) {
  if (o.data == "synthetic") return minillm::make_synthetic_dataset(o.model.vocab, o.seq, o.seed);
  if (o.data == "auto") {
    if (std::filesystem::exists(minillm::kDefaultTextPath)) {
      return minillm::make_text_dataset(minillm::kDefaultTextPath, o.seq, o.seed);
    }
    return minillm::make_synthetic_dataset(o.model.vocab, o.seq, o.seed);
  }
  return minillm::make_text_dataset(o.data, o.seq, o.seed);
}

int threads_for(const Options& o) {
  if (o.threads > 0) return o.threads;
  const char* local = std::getenv("LOCAL_WORLD_SIZE");
  if (!local) local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / ranks_here);
}

fsdp::FullyShardOptions root_options(const Options& o) {
  fsdp::FullyShardOptions opts;
  if (o.dtype == "bf16") {
    opts.mp_policy.param_dtype = torch::kBFloat16;
    opts.mp_policy.reduce_dtype = torch::kFloat;
  }
  return opts;
}

// Builds the model with the values a single process gets from --seed and shards it: every
// block a unit, then the root. By default each block is sharded as soon as it is built, so a
// rank never holds more than its shards, one full block and the root's own parameters
// (embedding, head); the random numbers are drawn in the same order as for the whole model, so
// the values are the same. --init-from then replaces them, each rank reading its own rows.
fsdp::Unit<fsdp::models::minillm::MiniLLM> build_sharded_model(const Options& o, const fsdp::Distributed& dist,
                                                 const fsdp::DeviceMesh& mesh) {
  auto block_options = root_options(o);
  block_options.reshard_after_forward = o.reshard_after_forward;
  block_options.activation_checkpointing = o.activation_checkpointing;
  auto shard_block = [&](int64_t, fsdp::Unit<fsdp::models::minillm::TransformerBlock>& block) {
    block->to(dist.device);
    fsdp::fully_shard(block, mesh, block_options);
  };
  fsdp::models::minillm::MiniLLMImpl::BlockBuilt on_built;
  if (!o.init_full_model) on_built = shard_block;
  torch::manual_seed(o.seed);
  fsdp::models::minillm::MiniLLM model(o.model, on_built);
  if (o.init_full_model) {
    model->to(dist.device);
    for (size_t i = 0; i < model->layers.size(); ++i) shard_block(i, model->layers[i]);
  }
  model->to(dist.device);  // the root's own parameters
  auto root = fsdp::fully_shard(model, mesh, root_options(o));
  if (!o.init_from.empty()) fsdp::load_safetensors_sharded(o.init_from, *model, dist.group);
  return root;
}

// --resume: the step to start from (0 without a checkpoint), with model and optimizer loaded.
int resume(const Options& o, fsdp::models::minillm::MiniLLMImpl& model, torch::optim::Optimizer& opt,
           const fsdp::Distributed& dist) {
  if (!o.resume) return 0;
  auto latest = fsdp::latest_checkpoint(o.save_dir);
  const bool lead = dist.group->rank() == 0;
  if (!latest) {
    if (lead) fmt::print("resume: no checkpoint in {}; starting at step 0\n", o.save_dir);
    return 0;
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto info = fsdp::load_checkpoint(*latest, model, &opt, dist.group);
  if (lead) {
    fmt::print("resume: {} (step {}, saved by {} ranks) loaded in {:.2f} s\n", info.path, info.step,
               info.world_size,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return static_cast<int>(info.step);
}

// The counters of the world group, and with hybrid sharding of the shard and replicate groups.
std::vector<fsdp::CollectiveStats> group_stats(const fsdp::DeviceMesh& mesh) {
  std::vector<fsdp::CollectiveStats> out{mesh.world->stats()};
  if (mesh.hybrid()) {
    out.push_back(mesh.shard->stats());
    out.push_back(mesh.replicate->stats());
  }
  return out;
}

// End of --profile-steps: each rank writes its trace; rank 0 prints the operator table and
// the communication figures read from its trace, beside the trainer's own exposed time.
void report_profile(const Options& o, const fsdp::Distributed& dist, const fsdp::DeviceMesh& mesh,
                    double trainer_exposed_s, const std::vector<fsdp::CollectiveStats>& before) {
  const int rank = dist.group->rank();
  const auto after = group_stats(mesh);
  std::filesystem::create_directories(o.profile_dir);
  const std::string path = fmt::format("{}/rank{}.json", o.profile_dir, rank);
  auto summary = fsdp::stop_profiling(path);
  if (rank != 0) return;
  fmt::print("profile: steps {}..{} -> {}/rank*.json (open in https://ui.perfetto.dev)\n{}",
             o.profile_first, o.profile_last, o.profile_dir, fsdp::format_op_table(summary));
  fmt::print(
      "profile: compute {:.1f} ms on the training thread, communication {:.1f} ms on the comm "
      "thread, exposed (training thread waiting) {:.1f} ms (the trainer's own count: {:.1f} ms), "
      "overlap {:.0f}%\n",
      summary.compute_ms, summary.comm_ms, summary.exposed_comm_ms, 1e3 * trainer_exposed_s,
      100 * summary.overlap);
  const char* names[] = {"the process group", "the shard group", "the replicate group"};
  for (size_t g = 0; g < after.size(); ++g) {
    auto issued = [&](fsdp::CollectiveKind k) { return after[g].count(k) - before[g].count(k); };
    fmt::print("profile: {} issued {} all-gathers, {} reduce-scatters, {} all-reduces\n", names[g],
               issued(fsdp::CollectiveKind::kAllGather),
               issued(fsdp::CollectiveKind::kReduceScatter),
               issued(fsdp::CollectiveKind::kAllReduce));
  }
  fmt::print("profile: waits per unit (training thread)\n{}", fsdp::format_unit_waits(summary));
  if (o.profile_shapes) {
    fmt::print("profile: roofline: scripts/roofline.py {} --steps {}\n", path,
               o.profile_last - o.profile_first + 1);
  }
}

// Whether every rank's loss and the global gradient norm are finite (one all-reduce of the loss
// sum: a NaN or infinity on any rank reaches every rank).
bool finite_step(const torch::Tensor& loss, double grad_norm, const fsdp::Distributed& dist) {
  auto sum = loss.detach().to(torch::kDouble).reshape({1}).clone();
  dist.group->all_reduce(sum, fsdp::ReduceOp::kSum)->wait();
  return std::isfinite(grad_norm) && std::isfinite(sum.item<double>());
}

// A checkpoint after `steps_done` steps.
void save(const Options& o, int steps_done, const fsdp::models::minillm::MiniLLMImpl& model,
          const torch::optim::Optimizer& opt, const fsdp::Distributed& dist) {
  const auto t0 = std::chrono::steady_clock::now();
  fsdp::SaveOptions options;
  options.keep_last = o.keep;
  options.metadata["data_step"] = std::to_string(steps_done);
  auto path = fsdp::save_checkpoint(o.save_dir, steps_done, model, &opt, dist.group, options);
  if (dist.group->rank() == 0) {
    fmt::print("saved {} in {:.2f} s\n", path,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Options& o,
                                                        std::vector<torch::Tensor> params) {
  auto adamw = torch::optim::AdamWOptions(o.lr);
  if (o.optimizer == "fused-adamw") return std::make_unique<fsdp::FusedAdamW>(params, adamw);
  return std::make_unique<torch::optim::AdamW>(params, adamw);
}

int run(const Options& o, const fsdp::LaunchInfo& launch) {
  torch::set_num_threads(threads_for(o));
  fsdp::InitOptions init;
  init.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.comm_timeout_s * 1000));
  auto dist = fsdp::init_from_launch(launch, init);
  const int rank = dist.group->rank();
  const int64_t local_batch = o.batch / dist.group->size();
  const auto mesh = fsdp::make_device_mesh(dist.group, o.replicas);
  auto root = build_sharded_model(o, dist, mesh);
  const int64_t startup_peak = fsdp::host_peak_rss_bytes();
  auto opt = make_optimizer(o, root.parameters());
  auto data = open_data(o);
  minillm::Reporter report(o, dist);
  report.header(fsdp::models::minillm::parameter_count(o.model), root.memory_stats().sharded_param_bytes,
                startup_peak, data->describe());

  const int start = resume(o, *root.module(), *opt, dist);
  double profile_comm_before = 0;
  int skipped = 0;  // steps skipped by --nonfinite skip
  std::vector<fsdp::CollectiveStats> profile_stats_before;
  const int64_t micro = local_batch / o.grad_accum;
  for (int step = start; step < o.steps; ++step) {
    auto batch = data->slice(step, rank * local_batch, local_batch);
    auto tokens = batch.tokens.to(dist.device), targets = batch.targets.to(dist.device);
    if (step == o.profile_first) {
      profile_comm_before = root.comm_stats().exposed_seconds;
      profile_stats_before = group_stats(mesh);
      fsdp::start_profiling(fsdp::ProfileOptions{o.profile_shapes});
    }
    report.start_step(root.comm_stats());
    opt->zero_grad();
    // Micro-batches: gradients accumulate unsharded and are reduced with the last one (or
    // after each with --grad-accum-sync); each loss is scaled so the sum is the batch mean.
    auto loss_sum = torch::zeros({}, torch::dtype(torch::kFloat).device(dist.device));
    for (int k = 0; k < o.grad_accum; ++k) {
      root.set_requires_gradient_sync(o.grad_accum_sync || k + 1 == o.grad_accum);
      auto logits = root(tokens.narrow(0, k * micro, micro));
      auto loss = torch::nn::functional::cross_entropy(
                      logits.reshape({-1, o.model.vocab}).to(torch::kFloat),
                      targets.narrow(0, k * micro, micro).reshape(-1)) /
                  o.grad_accum;
      loss.backward();
      loss_sum += loss.detach();
    }
    double grad_norm = 0;
    if (o.clip_grad_norm > 0) {
      grad_norm = fsdp::clip_grad_norm_(root.parameters(), o.clip_grad_norm, mesh);
    } else if (o.nonfinite != "off") {
      grad_norm = fsdp::total_grad_norm(root.parameters(), mesh);
    }
    if (o.nonfinite != "off" && !finite_step(loss_sum, grad_norm, dist)) {
      // The same verdict on every rank: the norm and the loss sum are global.
      if (o.nonfinite == "stop") {
        throw fsdp::Error(fmt::format(
            "step {}: the loss or the gradient norm is not finite (gradient norm {}); stopped "
            "before the optimizer step (--nonfinite skip skips such steps instead)",
            step, grad_norm));
      }
      ++skipped;
      if (rank == 0) {
        fmt::print(
            "step {}: the loss or the gradient norm is not finite (gradient norm {}); "
            "optimizer step skipped ({} so far)\n",
            step, grad_norm, skipped);
      }
    } else {
      // Named so that a trace (and scripts/roofline.py) can tell the optimizer's ops apart.
      RECORD_USER_SCOPE("optimizer_step");
      opt->step();
    }
    report.end_step(step, loss_sum, grad_norm, root.comm_stats(), root.memory_stats());
    if (step == o.profile_last) {
      report_profile(o, dist, mesh, root.comm_stats().exposed_seconds - profile_comm_before,
                     profile_stats_before);
    }
    const int done = step + 1;
    const bool last = done == o.steps;
    if (!o.save_dir.empty() && ((o.save_every > 0 && done % o.save_every == 0) || last)) {
      save(o, done, *root.module(), *opt, dist);
    }
  }
  if (!o.export_path.empty()) {
    fsdp::ExportOptions options;
    if (o.export_dtype == "bf16") options.dtype = torch::kBFloat16;
    fsdp::export_safetensors(o.export_path, *root.module(), dist.group, options);
    if (rank == 0) fmt::print("exported {}\n", o.export_path);
  }
  report.summary();
  if (skipped > 0 && rank == 0) {
    fmt::print("skipped {} of {} optimizer steps: the loss or the gradients were not finite\n",
               skipped, o.steps - start);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // The launch is read once: its world size validates the flags before any communication.
  fsdp::LaunchInfo launch;
  try {
    launch = fsdp::detect_launch();
  } catch (const fsdp::LaunchError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  // Every rank parses the same arguments and reaches the same verdict, so all exit before any
  // communication starts; only rank 0 prints it.
  auto parsed = minillm::parse_options(argc, argv, launch.world_size);
  if (!parsed.options) {
    if (launch.rank == 0) (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  // The planner needs no communication: one process describes any world.
  if (parsed.options->plan) return launch.rank == 0 ? minillm::run_plan(*parsed.options) : 0;
  if (parsed.options->track_host_memory) fsdp::track_host_tensor_memory();
  try {
    return run(*parsed.options, launch);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[rank {}/{}] error: {}\n", launch.rank, launch.world_size, e.what());
    return 1;
  }
}
