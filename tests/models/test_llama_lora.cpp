// LoRA on the Llama model: adapters named and shaped as PEFT's, frozen base weights, a fresh
// adapter that changes nothing, PEFT's forward formula, sharded training that reduces the
// adapters only, the merged Hugging Face export against the adapted model, PEFT adapter
// directories across world sizes, and bad input named before anything changes. (Parity with
// PEFT itself: tests/reference/llama_parity.py --lora; PEFT loading our export:
// tests/examples/lora_finetune.sh.)
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "fsdp/fsdp.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf_checkpoint.h"
#include "fsdp/models/llama_lora.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing::llama_lora_test {
namespace {

using models::is_lora_parameter;
using models::lora_target_names;
using models::LoraOptions;

constexpr uint64_t kSeed = 31;

LoraOptions all_targets(int64_t rank = 4) {
  LoraOptions lora;
  lora.rank = rank;
  lora.alpha = 8;
  lora.targets = lora_target_names();
  return lora;
}

llama::BuildOptions with_lora(const LoraOptions& lora) {
  llama::BuildOptions o;
  o.lora = lora;
  return o;
}

torch::Tensor tokens_for(int64_t vocab) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(7);
  return torch::randint(vocab, {2, 12}, g, torch::kLong);
}

// The base weights of `from` copied into `to` (by name; adapters untouched).
void copy_base(llama::LlamaForCausalLM& to, llama::LlamaForCausalLM& from) {
  torch::NoGradGuard no_grad;
  auto source = from->named_parameters();
  for (auto& p : to->named_parameters()) {
    if (!is_lora_parameter(p.key())) p.value().copy_(source[p.key()]);
  }
}

// Every lora_B drawn normal(0, 0.1) (PEFT's are zero until trained): an adapter that matters.
void randomize_b(torch::nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& p : module.named_parameters()) {
    if (p.key().find(".lora_B.") != std::string::npos) p.value().normal_(0.0, 0.1);
  }
}

TEST(LlamaLora, AdaptersHavePeftNamesShapesAndOnlyThemTrain) {
  const auto c = tiny_llama();
  auto model = build_seeded(c, kSeed, with_lora(all_targets()));
  auto params = model->named_parameters();
  ASSERT_TRUE(params.contains("model.layers.1.self_attn.q_proj.lora_A.weight"));
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.lora_A.weight"].sizes(),
            torch::IntArrayRef({4, c.hidden_size}));
  EXPECT_EQ(params["model.layers.1.self_attn.k_proj.lora_B.weight"].sizes(),
            torch::IntArrayRef({c.kv_size(), 4}));
  EXPECT_EQ(params["model.layers.0.mlp.down_proj.lora_A.weight"].sizes(),
            torch::IntArrayRef({4, c.intermediate_size}));
  int64_t trainable = 0;
  for (const auto& p : params) {
    EXPECT_EQ(p.value().requires_grad(), is_lora_parameter(p.key())) << p.key();
    if (p.value().requires_grad()) trainable += p.value().numel();
    if (p.key().find(".lora_B.") != std::string::npos) {
      EXPECT_EQ(p.value().abs().max().item<float>(), 0.0f) << p.key() << ": PEFT's B is zero";
    }
    if (p.key().find(".lora_A.") != std::string::npos) {
      // nn.Linear's init: uniform within 1 / sqrt(in).
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.value().size(1)));
      EXPECT_LE(p.value().abs().max().item<double>(), bound + 1e-7) << p.key();
      EXPECT_GT(p.value().abs().max().item<double>(), 0.5 * bound) << p.key();
    }
  }
  EXPECT_EQ(trainable, llama::lora_parameter_count(c, all_targets()));
  // 7 targets x 2 layers x rank 4 x (in + out).
  EXPECT_EQ(trainable,
            2 * 4 * (56 + 56 + 56 + 28 + 56 + 28 + 56 + 56 + 56 + 90 + 56 + 90 + 90 + 56));
}

TEST(LlamaLora, FreshAdaptersChangeNothingAndTheUpdateIsPeftsFormula) {
  const auto c = tiny_llama();
  auto plain = build_seeded(c, kSeed);
  auto lora = all_targets();
  lora.targets = {"q_proj", "down_proj"};
  auto adapted = build_seeded(c, kSeed + 1, with_lora(lora));
  copy_base(adapted, plain);
  const auto tokens = tokens_for(c.vocab_size);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(torch::equal(adapted(tokens), plain(tokens)));
  randomize_b(*adapted);
  // One adapted Linear: W x + B (A x) * alpha / rank.
  auto& q = adapted->model->layers[0]->self_attn->q_proj;
  const auto x = torch::randn({3, c.hidden_size});
  const auto want =
      torch::matmul(x, q->weight.t()) +
      torch::matmul(torch::matmul(x, q->lora_A->weight.t()), q->lora_B->weight.t()) * (8.0 / 4.0);
  EXPECT_TRUE(torch::allclose(q(x), want, 1e-5, 1e-6));
  EXPECT_FALSE(torch::allclose(adapted(tokens), plain(tokens), 1e-3, 1e-3));
}

// One step at world 1 unsharded and at world 3 sharded (uneven rows): the same adapters after
// AdamW on the adapters alone; the base weights get no gradient and do not move.
TEST(LlamaLora, ShardedTrainingMatchesUnshardedAndMovesAdaptersOnly) {
  const auto c = tiny_llama(/*tied=*/true);
  const auto lora = all_targets();
  const auto tokens = tokens_for(c.vocab_size);
  auto train = [&](int world) {
    FullStateDict out;
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          auto o = with_lora(lora);
          o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
            randomize_b(*layer.module());
            fully_shard(layer, pg);
          };
          auto model = build_seeded(c, kSeed, o);
          auto root = fully_shard(model, pg);
          std::vector<torch::Tensor> trainable;
          for (auto& p : model->parameters()) {
            if (p.requires_grad()) trainable.push_back(p);
          }
          torch::optim::AdamW opt(trainable, torch::optim::AdamWOptions(1e-2));
          for (int step = 0; step < 2; ++step) {
            opt.zero_grad();
            auto logits = root(tokens.narrow(1, 0, 11));
            auto loss = model->loss(logits, tokens.narrow(1, 1, 11));
            loss.backward();
            for (auto& p : model->named_parameters()) {
              EXPECT_EQ(p.value().grad().defined(), is_lora_parameter(p.key())) << p.key();
            }
            opt.step();
          }
          auto full = get_full_model_state_dict(*model, pg);
          if (pg->rank() == 0) out = full;
        },
        test_options());
    return out;
  };
  const auto one = train(1), three = train(3);
  const auto start = [&] {
    auto o = with_lora(lora);
    o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
      randomize_b(*layer.module());
    };
    FullStateDict s;
    auto m = build_seeded(c, kSeed, o);
    for (const auto& [name, t] : get_model_state_dict(*m)) s.emplace_back(name, t.local);
    return s;
  }();
  ASSERT_EQ(one.size(), three.size());
  ASSERT_EQ(one.size(), start.size());
  for (size_t i = 0; i < one.size(); ++i) {
    const auto& name = one[i].first;
    EXPECT_TRUE(torch::allclose(one[i].second, three[i].second, 1e-5, 1e-6)) << name;
    if (is_lora_parameter(name)) {
      EXPECT_FALSE(torch::equal(one[i].second, start[i].second)) << name << " did not train";
    } else {
      EXPECT_TRUE(torch::equal(one[i].second, start[i].second)) << name << " moved";
    }
  }
}

// The merged export (saved at world 2) loaded into a plain model gives the adapted model's
// logits; the adapted model is unchanged by the export.
TEST(LlamaLora, MergedExportComputesTheAdaptedModel) {
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    c.attention_bias = true;  // a bias between an adapted weight and its adapters
    const auto tokens = tokens_for(c.vocab_size);
    const std::string dir = scratch_path("lora_merged");
    torch::Tensor adapted_logits;
    run_local_ranks(
        2,
        [&](const ProcessGroupPtr& pg) {
          auto o = with_lora(all_targets());
          o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
            randomize_b(*layer.module());
            fully_shard(layer, pg);
          };
          auto model = build_seeded(c, kSeed, o);
          auto root = fully_shard(model, pg);
          torch::NoGradGuard no_grad;
          auto before = root(tokens);
          llama::save_hf_checkpoint(dir, *model, c, pg, {});
          EXPECT_TRUE(torch::equal(root(tokens), before));
          if (pg->rank() == 0) adapted_logits = before;
        },
        test_options());
    auto names = llama::parameter_names(c);
    std::set<std::string> in_file;
    for (const auto& f : llama::hf_weight_files(dir)) {
      for (const auto& e : read_safetensors_index(dir + "/" + f).entries) in_file.insert(e.name);
    }
    EXPECT_EQ(in_file, std::set<std::string>(names.begin(), names.end()));
    run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
      llama::BuildOptions o;
      o.random_init = false;
      auto plain = build_seeded(c, kSeed, o);
      llama::load_hf_weights(dir, *plain, pg);
      torch::NoGradGuard no_grad;
      const auto got = plain(tokens);
      EXPECT_LT((got - adapted_logits).abs().max().item<double>(),
                1e-5 * adapted_logits.abs().max().item<double>());
    });
    remove_all(dir);
  }
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Saved at world 2, loaded at world 3 into a model with other adapters: the adapters bit for
// bit, the base weights untouched; PEFT's names and config.
TEST(LlamaLora, PeftAdapterDirectoriesRoundTripAcrossWorlds) {
  const auto c = tiny_llama();
  auto lora = all_targets();
  lora.targets = {"v_proj", "q_proj", "up_proj"};
  const std::string dir = scratch_path("peft_adapter");
  auto sharded = [&](const ProcessGroupPtr& pg, uint64_t seed) {
    auto o = with_lora(lora);
    o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
      randomize_b(*layer.module());
      fully_shard(layer, pg);
    };
    auto model = build_seeded(c, seed, o);
    fully_shard(model, pg);
    return model;
  };
  FullStateDict saved;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded(pg, kSeed);
        llama::PeftSaveOptions o;
        o.base_model = "some/base";
        llama::save_peft_adapter(dir, *model, lora, pg, o);
        auto full = get_full_model_state_dict(*model, pg);
        if (pg->rank() == 0) saved = full;
      },
      test_options());
  std::set<std::string> names;
  for (const auto& e : read_safetensors_index(dir + "/adapter_model.safetensors").entries) {
    names.insert(e.name);
  }
  EXPECT_EQ(names.size(), 2u * 3u * 2u);
  EXPECT_TRUE(names.count("base_model.model.model.layers.1.mlp.up_proj.lora_B.weight"));
  const auto config = read_text(dir + "/adapter_config.json");
  EXPECT_NE(config.find("\"peft_type\": \"LORA\""), std::string::npos) << config;
  EXPECT_NE(config.find("\"base_model_name_or_path\": \"some/base\""), std::string::npos);
  const auto back = llama::read_peft_adapter_config(dir);
  EXPECT_EQ(back.rank, 4);
  EXPECT_EQ(back.alpha, 8);
  EXPECT_EQ(back.targets, (std::vector<std::string>{"q_proj", "v_proj", "up_proj"}));
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded(pg, kSeed + 5);
        const auto before = get_full_model_state_dict(*model, pg);
        llama::load_peft_adapter(dir, *model, lora, pg);
        const auto after = get_full_model_state_dict(*model, pg);
        if (pg->rank() != 0) return;
        for (size_t i = 0; i < after.size(); ++i) {
          const auto& want = is_lora_parameter(after[i].first) ? saved[i] : before[i];
          EXPECT_TRUE(torch::equal(after[i].second, want.second)) << after[i].first;
        }
      },
      test_options());
  remove_all(dir);
}

// Dropout draws in training mode only; activation checkpointing recomputes a unit with the
// first run's random state, so its gradients are those of the loss it reported.
TEST(LlamaLora, DropoutUnderActivationCheckpointingKeepsTheGradients) {
  const auto c = tiny_llama();
  auto lora = all_targets();
  lora.dropout = 0.5;
  const auto tokens = tokens_for(c.vocab_size);
  auto run = [&](bool checkpointed, bool eval) {
    std::pair<double, FullStateDict> out;
    run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
      FullyShardOptions unit;
      unit.activation_checkpointing = checkpointed;
      auto o = with_lora(lora);
      o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
        randomize_b(*layer.module());
        fully_shard(layer, pg, unit);
      };
      auto model = build_seeded(c, kSeed, o);
      auto root = fully_shard(model, pg);
      if (eval) model->eval();
      torch::manual_seed(99);  // the dropout masks
      auto loss = model->loss(root(tokens.narrow(1, 0, 11)), tokens.narrow(1, 1, 11));
      loss.backward();
      out.first = loss.item<double>();
      for (auto& p : model->named_parameters()) {
        if (p.value().grad().defined()) out.second.emplace_back(p.key(), p.value().grad().clone());
      }
    });
    return out;
  };
  const auto plain = run(false, false), checkpointed = run(true, false);
  const auto eval = run(false, true), eval_again = run(true, true);
  EXPECT_NEAR(plain.first, checkpointed.first, 1e-6 * plain.first);
  ASSERT_EQ(plain.second.size(), checkpointed.second.size());
  for (size_t i = 0; i < plain.second.size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain.second[i].second, checkpointed.second[i].second, 1e-5, 1e-7))
        << plain.second[i].first;
  }
  EXPECT_NE(plain.first, eval.first) << "dropout 0.5 changed nothing in training mode";
  EXPECT_NEAR(eval.first, eval_again.first, 1e-6 * eval.first);
}

TEST(LlamaLora, BadOptionsAreNamed) {
  const auto c = tiny_llama();
  auto lora = all_targets();
  lora.targets = {"q_proj", "qkv_proj"};
  expect_error_containing<InvalidArgument>([&] { llama::validate_lora(c, lora); },
                                           "LoRA target 'qkv_proj' names no module");
  lora = all_targets(29);  // k_proj's output is 28
  expect_error_containing<InvalidArgument>([&] { llama::validate_lora(c, lora); },
                                           "rank 29 is larger than k_proj's weight allows");
  expect_error_containing<InvalidArgument>([&] { build_seeded(c, kSeed, with_lora(lora)); },
                                           "rank 29 is larger");
  lora = all_targets();
  expect_error_containing<InvalidArgument>([&] { llama::validate_lora(c, lora, 2); },
                                           "tensor parallelism");
  lora.targets = {"q_proj", "q_proj"};
  expect_error_containing<InvalidArgument>([&] { llama::validate_lora(c, lora); }, "given twice");
  lora = all_targets();
  lora.dropout = 1.0;
  expect_error_containing<InvalidArgument>([&] { llama::validate_lora(c, lora); }, "dropout");
}

TEST(LlamaLora, BadAdapterDirectoriesChangeNothing) {
  const auto c = tiny_llama();
  const auto lora = all_targets();
  const std::string dir = scratch_path("peft_bad");
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = build_seeded(c, kSeed, with_lora(lora));
    auto plain = build_seeded(c, kSeed);
    expect_error_containing<CheckpointError>(
        [&] { llama::save_peft_adapter(dir, *plain, lora, pg); }, "no LoRA adapters");
    llama::save_peft_adapter(dir, *model, lora, pg);
    expect_error_containing<CheckpointError>(
        [&] { llama::save_peft_adapter(dir, *model, lora, pg); }, "not an empty directory");
    // Options that do not describe the model's adapters would write a wrong config.
    auto wrong = lora;
    wrong.alpha = 32;
    expect_error_containing<CheckpointError>(
        [&] { llama::save_peft_adapter(dir + "_alpha", *model, wrong, pg); }, "scales by 2");
    wrong = lora;
    wrong.targets.pop_back();
    expect_error_containing<CheckpointError>(
        [&] { llama::save_peft_adapter(dir + "_targets", *model, wrong, pg); },
        "adapts down_proj, which the targets");
    // Another rank: named, nothing changed.
    auto other = all_targets(2);
    auto small = build_seeded(c, kSeed + 1, with_lora(other));
    const auto before = get_full_model_state_dict(*small, pg);
    expect_error_containing<CheckpointError>(
        [&] { llama::load_peft_adapter(dir, *small, other, pg); }, "rank 4 alpha 8");
    expect_same_tensors(get_full_model_state_dict(*small, pg), before);
  });
  // A base weight in the adapter file (PEFT's save_embedding_layers) is not set silently.
  {
    auto adapters = read_safetensors(dir + "/adapter_model.safetensors");
    adapters.emplace_back("base_model.model.model.norm.weight", torch::ones({c.hidden_size}));
    write_safetensors(dir + "/adapter_model.safetensors", adapters);
    run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
      auto model = build_seeded(c, kSeed, with_lora(lora));
      expect_error_containing<CheckpointError>(
          [&] { llama::load_peft_adapter(dir, *model, lora, pg); },
          "tensors the model does not have: 'model.norm.weight'");
    });
  }
  // What PEFT can write but this library does not build is refused, not ignored.
  std::string config = read_text(dir + "/adapter_config.json");
  const auto at = config.find("\"use_dora\": false");
  ASSERT_NE(at, std::string::npos);
  config.replace(at, 17, "\"use_dora\": true");
  std::ofstream(dir + "/adapter_config.json") << config;
  expect_error_containing<CheckpointError>([&] { llama::read_peft_adapter_config(dir); },
                                           "use_dora is not supported");
  remove_all(dir);
  expect_error_containing<CheckpointError>([&] { llama::read_peft_adapter_config(dir); },
                                           "no adapter_config.json");
}

}  // namespace
}  // namespace fsdp::testing::llama_lora_test
