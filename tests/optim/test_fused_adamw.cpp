// fsdp::FusedAdamW against torch::optim::AdamW: the same parameters after 20 steps within float
// rounding, the same state layout, and the same behaviour for options and missing gradients.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "fsdp/errors.h"
#include "fsdp/models/minillm.h"
#include "fsdp/optim/fused_adamw.h"
#include "support/torch_api.h"

namespace {

fsdp::models::minillm::MiniLLM tiny_model() {
  torch::manual_seed(3);
  return fsdp::models::minillm::MiniLLM(
      fsdp::models::minillm::Config{/*vocab=*/97, /*dim=*/32, /*layers=*/2, /*heads=*/4});
}

// Steps a copy of tiny_model() `steps` times with optimizer type Opt, feeding the same gradient
// sequence to every run (random, independent of the parameters): rounding differences then stay
// rounding-sized instead of being amplified by training, where Adam turns the noise of a
// zero-gradient parameter (attention's key bias) into full-size steps. Returns the parameters.
template <typename Opt>
std::vector<torch::Tensor> train(
    torch::optim::AdamWOptions options, int steps,
    std::function<void(fsdp::models::minillm::MiniLLM&)> edit = nullptr) {
  auto model = tiny_model();
  if (edit) edit(model);
  Opt opt(model->parameters(), options);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  for (int s = 0; s < steps; ++s) {
    for (auto& p : model->parameters()) {
      auto g = at::randn(p.sizes(), gen, torch::kFloat) * (1 + s % 3);
      if (p.requires_grad()) p.mutable_grad() = g;
    }
    opt.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

double max_rel_diff(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = std::max(b[i].abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

TEST(FusedAdamW, MatchesLibtorchAdamW) {
  auto opts = torch::optim::AdamWOptions(1e-2);
  auto want = train<torch::optim::AdamW>(opts, 20);
  auto got = train<fsdp::FusedAdamW>(opts, 20);
  auto start = train<torch::optim::AdamW>(opts, 0);
  EXPECT_LT(max_rel_diff(got, want), 1e-6);
  EXPECT_GT(max_rel_diff(want, start), 1e-2);  // the steps did move the parameters
}

TEST(FusedAdamW, MatchesWithWeightDecayBetasAndAmsgrad) {
  auto opts =
      torch::optim::AdamWOptions(3e-3).weight_decay(0.1).betas({0.8, 0.95}).eps(1e-6).amsgrad(true);
  EXPECT_LT(max_rel_diff(train<fsdp::FusedAdamW>(opts, 15), train<torch::optim::AdamW>(opts, 15)),
            1e-6);
}

TEST(FusedAdamW, SkipsFrozenParametersAndKeepsLibtorchState) {
  auto freeze = [](fsdp::models::minillm::MiniLLM& m) { m->head->weight.set_requires_grad(false); };
  auto opts = torch::optim::AdamWOptions(1e-2);
  auto want = train<torch::optim::AdamW>(opts, 5, freeze);
  auto got = train<fsdp::FusedAdamW>(opts, 5, freeze);
  EXPECT_LT(max_rel_diff(got, want), 1e-6);
  auto start = tiny_model();
  EXPECT_TRUE(at::equal(got.back(), start->head->weight));  // head.weight is the last parameter

  auto model = tiny_model();
  fsdp::FusedAdamW opt(model->parameters(), opts);
  for (auto& p : model->parameters()) p.mutable_grad() = torch::ones_like(p);
  opt.step();
  opt.step();
  ASSERT_EQ(opt.state().size(), model->parameters().size());
  for (const auto& [key, state] : opt.state()) {
    auto& s = static_cast<torch::optim::AdamWParamState&>(*state);
    EXPECT_EQ(s.step(), 2);
    EXPECT_TRUE(s.exp_avg().defined() && s.exp_avg_sq().defined());
  }
}

TEST(FusedAdamW, RejectsSparseGradients) {
  auto w = torch::zeros({4, 3}, torch::requires_grad());
  fsdp::FusedAdamW opt({w}, torch::optim::AdamWOptions(1e-3));
  w.mutable_grad() = torch::sparse_coo_tensor(torch::tensor({{0}}), torch::ones({1, 3}), {4, 3});
  EXPECT_THROW(opt.step(), fsdp::InvalidArgument);
}

}  // namespace
