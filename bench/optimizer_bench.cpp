// optimizer_bench: time of one AdamW step over MiniLLM's parameters, libtorch's per-parameter
// torch::optim::AdamW against fsdp::FusedAdamW (at::_fused_adamw_), alternating, medians.
// bench/reference/optimizer_step.py measures PyTorch's torch.optim.AdamW on the same model.
//   optimizer_bench [--dim 256 --layers 4 --vocab 32000 --rounds 5 --steps 10 --threads 1]
#include <fmt/format.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>

#include "fsdp/models/minillm.h"
#include "fsdp/optim/fused_adamw.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds per step of `opt` over `steps` steps, after one warm-up step that creates the state.
double time_steps(torch::optim::Optimizer& opt, int steps) {
  opt.step();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) opt.step();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"AdamW step time: torch::optim::AdamW vs fsdp::FusedAdamW"};
  fsdp::models::minillm::Config config;
  int rounds = 5, steps = 10, threads = 1;
  app.add_option("--vocab", config.vocab)->capture_default_str();
  app.add_option("--dim", config.dim)->capture_default_str();
  app.add_option("--layers", config.layers)->capture_default_str();
  app.add_option("--heads", config.heads)->capture_default_str();
  app.add_option("--rounds", rounds)->capture_default_str();
  app.add_option("--steps", steps)->capture_default_str();
  app.add_option("--threads", threads)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  torch::set_num_threads(threads);

  torch::manual_seed(0);
  fsdp::models::minillm::MiniLLM a(config), b(config);
  int64_t n = 0;
  for (auto* m : {&a, &b}) {
    for (auto& p : (*m)->parameters()) p.mutable_grad() = torch::randn_like(p);
  }
  for (auto& p : a->parameters()) n += p.numel();
  torch::optim::AdamW plain(a->parameters(), torch::optim::AdamWOptions(3e-4));
  fsdp::FusedAdamW fused(b->parameters(), torch::optim::AdamWOptions(3e-4));
  std::vector<double> t_plain, t_fused;
  for (int r = 0; r < rounds; ++r) {
    t_plain.push_back(time_steps(plain, steps));
    t_fused.push_back(time_steps(fused, steps));
  }
  double p = median(t_plain), f = median(t_fused);
  fmt::print("params {:.2f}M, {} thread(s), median of {} rounds x {} steps\n", n / 1e6, threads,
             rounds, steps);
  fmt::print("adamw_ms torch::optim::AdamW {:.2f}\n", 1e3 * p);
  fmt::print("adamw_ms fsdp::FusedAdamW {:.2f}\n", 1e3 * f);
  fmt::print("speedup {:.2f}x\n", p / f);
  return 0;
}
