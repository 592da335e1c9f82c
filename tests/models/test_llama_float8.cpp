// Llama with float8 Linears (BuildOptions::float8, fsdp/models/float8_options.h): which Linears
// convert, that the converted model computes float8's rounding of the same model (close, not
// equal) and trains through it, and the options refused by name. Equality with torchao's
// Float8Linear under FSDP2 is llama_parity_float8_world{1,2} (tests/reference/llama_parity.py).
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "fsdp/models/llama.h"
#include "fsdp/ops/float8.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"

namespace fsdp::testing::llama_float8_test {
namespace {

constexpr uint64_t kSeed = 11;

// Multiples of 16 everywhere but the vocabulary (the head stays out of float8).
llama::Config float8_llama() {
  auto c = tiny_llama();
  c.hidden_size = 64;  // head size 16
  c.intermediate_size = 96;
  return c;
}

llama::BuildOptions with_float8(std::vector<std::string> skip = {}) {
  llama::BuildOptions o;
  o.float8.enabled = true;
  o.float8.skip = std::move(skip);
  return o;
}

torch::Tensor tokens_for(int64_t vocab) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  return torch::randint(vocab, {2, 16}, g, torch::kLong);
}

TEST(LlamaFloat8, ConvertsTheDecoderLinearsButTheSkippedOnes) {
  const auto c = float8_llama();
  auto model = build_seeded(c, kSeed, with_float8({"k_proj", "v_proj"}));
  for (auto& layer : model->model->layers) {
    EXPECT_TRUE(layer->self_attn->q_proj->float8());
    EXPECT_FALSE(layer->self_attn->k_proj->float8());
    EXPECT_FALSE(layer->self_attn->v_proj->float8());
    EXPECT_TRUE(layer->self_attn->o_proj->float8());
    EXPECT_TRUE(layer->mlp->gate_proj->float8());
    EXPECT_TRUE(layer->mlp->up_proj->float8());
    EXPECT_TRUE(layer->mlp->down_proj->float8());
  }
  EXPECT_FALSE(model->lm_head->float8());
  auto plain = build_seeded(c, kSeed);
  for (auto& layer : plain->model->layers) EXPECT_FALSE(layer->mlp->up_proj->float8());
}

TEST(LlamaFloat8, ComputesFloat8sRoundingOfTheSameModelAndTrains) {
  const auto c = float8_llama();
  auto f8 = build_seeded(c, kSeed, with_float8());
  auto plain = build_seeded(c, kSeed);
  // The same initial weights: float8 changes the GEMMs, not the parameters.
  auto fp = f8->named_parameters(), pp = plain->named_parameters();
  for (auto& p : pp) ASSERT_TRUE(fp[p.key()].equal(p.value())) << p.key();
  const auto tokens = tokens_for(c.vocab_size);
  const auto inputs = tokens.slice(1, 0, 15), targets = tokens.slice(1, 1, 16);
  auto loss_f8 = f8->loss(f8->forward(inputs), targets);
  auto loss_plain = plain->loss(plain->forward(inputs), targets);
  const double rel =
      std::abs(loss_f8.item<double>() - loss_plain.item<double>()) / loss_plain.item<double>();
  EXPECT_GT(rel, 0.0);   // float8 was on
  EXPECT_LT(rel, 0.02);  // and only a rounding
  loss_f8.backward();
  for (auto& p : f8->named_parameters()) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(p.value().grad().isfinite().all().item<bool>()) << p.key();
  }
  // One float8 Linear by hand: its output is ops::float8_linear's.
  auto& up = f8->model->layers[0]->mlp->up_proj;
  auto x = torch::randn({3, c.hidden_size});
  EXPECT_TRUE(up->forward(x).equal(ops::float8_linear(x, up->weight, up->bias)));
}

TEST(LlamaFloat8, BadOptionsAreNamed) {
  const auto c = float8_llama();
  expect_error_containing<InvalidArgument>(
      [&] { llama::validate_float8(c, with_float8({"kproj"}).float8); },
      "'kproj' to skip names no Linear");
  expect_error_containing<InvalidArgument>(
      [&] { llama::validate_float8(c, with_float8().float8, /*tp_size=*/2); },
      "tensor parallelism (degree 2)");
  expect_error_containing<InvalidArgument>(
      [&] { llama::validate_float8(c, with_float8().float8, 1, /*lora=*/true); }, "LoRA");
  auto off = with_float8({"k_proj"});
  off.float8.enabled = false;
  expect_error_containing<InvalidArgument>([&] { llama::validate_float8(c, off.float8); },
                                           "float8 is off");
  auto rowwise_off = with_float8();
  rowwise_off.float8.enabled = false;
  rowwise_off.float8.scaling = ops::Float8Scaling::rowwise;
  expect_error_containing<InvalidArgument>([&] { llama::validate_float8(c, rowwise_off.float8); },
                                           "rowwise scaling but float8 is off");
  // tiny_llama's intermediate 90 and hidden 56: not multiples of 16, named, before any build.
  expect_error_containing<InvalidArgument>(
      [&] { build_seeded(tiny_llama(), kSeed, with_float8()); }, "q_proj is a Linear of 56 inputs");
  auto c90 = float8_llama();
  c90.intermediate_size = 90;
  expect_error_containing<InvalidArgument>(
      [&] { llama::validate_float8(c90, with_float8({"k_proj"}).float8); },
      "gate_proj is a Linear of 64 inputs and 90 outputs");
  EXPECT_NO_THROW(
      llama::validate_float8(c90, with_float8({"gate_proj", "up_proj", "down_proj"}).float8));
}

}  // namespace
}  // namespace fsdp::testing::llama_float8_test
