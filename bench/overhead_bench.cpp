// The cost of sharding at world size 1: the same MiniLLM training step with and without
// fully_shard, in one process, alternating rounds so machine noise hits both alike.
//   build/bin/overhead_bench [--rounds 5 --steps 6 --threads 1 --dtype fp32]
#include <fmt/format.h>
#include <torch/nn/functional/loss.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>

#include "fsdp/fsdp.h"
#include "fsdp/models/minillm.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median step time of `steps` steps after one warm-up step.
double time_steps(bool sharded, const fsdp::models::minillm::Config& cfg, int64_t batch,
                  int64_t seq, int steps, const std::string& dtype) {
  torch::manual_seed(0);
  fsdp::models::minillm::MiniLLM model(cfg);
  fsdp::Unit<fsdp::models::minillm::MiniLLM> root(model);
  if (sharded) {
    auto pg = fsdp::make_local_groups(1).front();
    fsdp::FullyShardOptions opts;
    if (dtype == "bf16") {
      opts.mp_policy.param_dtype = torch::kBFloat16;
      opts.mp_policy.reduce_dtype = torch::kFloat;
    }
    for (auto& layer : model->layers) fsdp::fully_shard(layer, pg, opts);
    root = fsdp::fully_shard(model, pg, opts);
  } else if (dtype == "bf16") {
    model->to(torch::kBFloat16);  // plain bf16 training: no fp32 master, the cheapest baseline
  }
  torch::optim::AdamW opt(root->parameters(), torch::optim::AdamWOptions(3e-4));
  auto gen = at::detail::createCPUGenerator(1);
  std::vector<double> times;
  for (int step = 0; step <= steps; ++step) {
    auto tokens = at::randint(cfg.vocab, {batch, seq}, gen, at::kLong);
    auto targets = at::randint(cfg.vocab, {batch, seq}, gen, at::kLong);
    auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(
        root(tokens).reshape({-1, cfg.vocab}).to(torch::kFloat), targets.reshape(-1));
    loss.backward();
    opt.step();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step > 0) times.push_back(s);
  }
  return median(times);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fully_shard overhead at world size 1 against the same model without FSDP"};
  fsdp::models::minillm::Config cfg;  // cpu-small: vocab 32000, dim 256, 4 layers, 8 heads
  int64_t batch = 4, seq = 128;
  int rounds = 5, steps = 6, threads = 1;
  std::string dtype = "fp32";
  app.add_option("--vocab", cfg.vocab)->capture_default_str();
  app.add_option("--dim", cfg.dim)->capture_default_str();
  app.add_option("--layers", cfg.layers)->capture_default_str();
  app.add_option("--heads", cfg.heads)->capture_default_str();
  app.add_option("--batch", batch)->capture_default_str();
  app.add_option("--seq", seq)->capture_default_str();
  app.add_option("--rounds", rounds, "Alternating rounds of each variant")->capture_default_str();
  app.add_option("--steps", steps, "Timed steps per round")->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"fp32", "bf16"}))->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);
  std::vector<double> plain, sharded;
  for (int r = 0; r < rounds; ++r) {
    plain.push_back(time_steps(false, cfg, batch, seq, steps, dtype));
    sharded.push_back(time_steps(true, cfg, batch, seq, steps, dtype));
    fmt::print("round {}: plain {:.4f} s/step, fully_shard {:.4f} s/step\n", r, plain.back(),
               sharded.back());
  }
  double p = median(plain), s = median(sharded);
  fmt::print("RESULT dtype={} threads={} plain_s={:.4f} fsdp_s={:.4f} overhead={:+.1f}%\n", dtype,
             threads, p, s, 100 * (s / p - 1));
  return 0;
}
