// train_minillm: the MiniLLM example trainer. Every block is a fully_shard unit, then the root;
// AdamW over the shards; a plain training loop. See README.md beside this file.
#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "data.h"
#include "fsdp/fsdp.h"
#include "model.h"
#include "options.h"

namespace {

using minillm::Options;

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

int run(const Options& o) {
  torch::set_num_threads(threads_for(o));
  auto dist = fsdp::init_from_env();
  auto& pg = *dist.group;
  const bool lead = pg.rank() == 0;
  const int world = pg.size();
  const int64_t local_batch = o.batch / world;

  // Every rank builds the full model from the same seed (the parameters a single process would
  // have), then keeps only its shards.
  torch::manual_seed(o.seed);
  minillm::MiniLLM model(o.model);
  if (!o.init_from.empty()) fsdp::load_safetensors_into(*model, o.init_from);
  model->to(dist.device);
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();

  fsdp::FullyShardOptions shard_opts;
  if (o.dtype == "bf16") {
    shard_opts.mp_policy.param_dtype = torch::kBFloat16;
    shard_opts.mp_policy.reduce_dtype = torch::kFloat;
  }
  for (auto& layer : model->layers) {
    auto block_opts = shard_opts;
    block_opts.reshard_after_forward = o.reshard_after_forward;
    fsdp::fully_shard(layer, dist.group, block_opts);
  }
  auto root = fsdp::fully_shard(model, dist.group, shard_opts);
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (o.optimizer == "fused-adamw") {
    optimizer =
        std::make_unique<fsdp::FusedAdamW>(root->parameters(), torch::optim::AdamWOptions(o.lr));
  } else {
    optimizer =
        std::make_unique<torch::optim::AdamW>(root->parameters(), torch::optim::AdamWOptions(o.lr));
  }
  auto& opt = *optimizer;
  auto data = open_data(o);

  auto shard_bytes = root.memory_stats().sharded_param_bytes;
  if (lead) {
    fmt::print("MiniLLM | world {} | backend {} | device {} | dtype {}\n", world, pg.backend_name(),
               dist.device.str(), o.dtype);
    fmt::print(
        "model: vocab {} dim {} layers {} heads {} seq {} | {:.2f}M parameters ({:.1f} "
        "MiB fp32)\n",
        o.model.vocab, o.model.dim, o.model.layers, o.model.heads, o.seq, n_params / 1e6,
        mib(n_params * 4));
    fmt::print(
        "per rank: parameter shards {:.1f} MiB, + gradients and AdamW state about {:.1f} "
        "MiB more (ZeRO-3: 16 bytes/param / {})\n",
        mib(shard_bytes), mib(3 * shard_bytes), world);
    fmt::print("data: {} | global batch {} sequences ({} per rank) | {} steps\n", data->describe(),
               o.batch, local_batch, o.steps);
  }

  std::ofstream metrics;
  if (lead && !o.metrics_out.empty()) {
    metrics.open(o.metrics_out);
    if (!metrics) throw fsdp::InvalidArgument("cannot write --metrics-out " + o.metrics_out);
  }

  std::vector<double> step_times, token_rates;
  double first_loss = 0, last_loss = 0;
  int64_t peak_mem = 0;
  const bool cuda = dist.device.is_cuda();
  for (int step = 0; step < o.steps; ++step) {
    auto batch = data->slice(step, pg.rank() * local_batch, local_batch);
    auto tokens = batch.tokens.to(dist.device);
    auto targets = batch.targets.to(dist.device);
    double comm_before = root.comm_stats().exposed_seconds;
    if (cuda) torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();

    opt.zero_grad();
    auto logits = root(tokens);
    auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, o.model.vocab}).to(torch::kFloat), targets.reshape(-1));
    loss.backward();
    opt.step();

    if (cuda) torch::cuda::synchronize();
    double step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double exposed = root.comm_stats().exposed_seconds - comm_before;
    auto global_loss = loss.detach().reshape({1}).clone();
    pg.all_reduce(global_loss, fsdp::ReduceOp::kAvg)->wait();
    int64_t mem =
        cuda ? fsdp::cuda_peak_allocated_bytes(dist.device.index()) : fsdp::host_peak_rss_bytes();
    peak_mem = max_over_ranks(pg, mem, dist.device);
    double loss_value = global_loss.item<double>();
    double tokens_per_s = o.batch * o.seq / step_s;
    if (step == 0) first_loss = loss_value;
    last_loss = loss_value;
    step_times.push_back(step_s);
    token_rates.push_back(tokens_per_s);
    if (lead) {
      auto m = root.memory_stats();
      fmt::print(
          "step {:>4} | loss {:.4f} | {:>8.0f} tok/s | step {:.3f} s (compute {:.3f}, "
          "exposed comm {:.3f}) | peak {} {:.0f} MiB/rank | full params peak {:.1f} "
          "MiB\n",
          step, loss_value, tokens_per_s, step_s, step_s - exposed, exposed,
          cuda ? "allocated" : "rss", mib(peak_mem), mib(m.peak_full_param_bytes));
      std::fflush(stdout);
      if (metrics.is_open()) {
        nlohmann::json j = {{"step", step},
                            {"loss", loss_value},
                            {"tokens_per_s", tokens_per_s},
                            {"step_s", step_s},
                            {"compute_s", step_s - exposed},
                            {"exposed_comm_s", exposed},
                            {"peak_mem_bytes", peak_mem},
                            {"peak_full_param_bytes", m.peak_full_param_bytes},
                            {"sharded_param_bytes", m.sharded_param_bytes},
                            {"sharded_grad_bytes", m.sharded_grad_bytes},
                            {"peak_comm_buffer_bytes", m.peak_comm_buffer_bytes},
                            {"world", world}};
        metrics << j.dump() << "\n";
        metrics.flush();
      }
    }
  }
  if (lead) {
    // The first steps warm up allocators and caches: medians skip them when there are enough.
    size_t skip = step_times.size() > 4 ? 2 : 0;
    std::vector<double> rates(token_rates.begin() + skip, token_rates.end());
    std::vector<double> times(step_times.begin() + skip, step_times.end());
    double tps = median(rates);
    fmt::print(
        "done: loss {:.4f} -> {:.4f} | median {:.0f} tok/s, {:.3f} s/step | peak {:.0f} "
        "MiB/rank\n",
        first_loss, last_loss, tps, median(times), mib(peak_mem));
    if (cuda) {
      double mfu = tps / world * minillm::train_flops_per_token(o.model, o.seq) / 989e12;
      fmt::print("MFU {:.1f}% of 989 TFLOP/s dense bf16 per GPU\n", 100 * mfu);
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int rank = 0, world = 1;
  try {
    auto launch = fsdp::detect_launch();
    rank = launch.rank;
    world = launch.world_size;
  } catch (const fsdp::LaunchError& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    return 2;
  }
  // Every rank parses the same arguments and reaches the same verdict, so all exit before any
  // communication starts; only rank 0 prints it.
  auto parsed = minillm::parse_options(argc, argv, world);
  if (!parsed.options) {
    if (rank == 0) (parsed.exit_code == 0 ? std::cout : std::cerr) << parsed.message << "\n";
    return parsed.exit_code;
  }
  try {
    return run(*parsed.options);
  } catch (const std::exception& e) {
    fmt::print(stderr, "[rank {}/{}] error: {}\n", rank, world, e.what());
    return 1;
  }
}
