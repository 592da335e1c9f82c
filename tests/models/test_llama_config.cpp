// config.json in and out: transformers 5.24's text parses, every field round-trips, every field
// that changes the math and is not implemented is rejected by name, and the presets have the
// published parameter counts.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "fsdp/models/llama_config.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"

namespace fsdp::testing {
namespace {

// What transformers 5.24's save_pretrained writes for a small LlamaConfig (copied from a run).
const char* const kTransformersConfig = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 1,
  "dtype": "float32",
  "eos_token_id": 2,
  "head_dim": 8,
  "hidden_act": "silu",
  "hidden_size": 16,
  "initializer_range": 0.02,
  "intermediate_size": 32,
  "max_position_embeddings": 2048,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 2,
  "num_hidden_layers": 1,
  "num_key_value_heads": 1,
  "pad_token_id": null,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "tie_word_embeddings": false,
  "transformers_version": "5.24.0",
  "use_cache": true,
  "vocab_size": 101
})";

// A minimal config with one field replaced (or added): `edit` is spliced into the object.
std::string with(const std::string& edit, const std::string& model_type = "llama") {
  return R"({"model_type": ")" + model_type +
         R"(", "vocab_size": 100, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2)" +
         (edit.empty() ? "" : ", " + edit) + "}";
}

TEST(LlamaConfig, ParsesWhatTransformersWrites) {
  auto c = llama::from_hf_json(kTransformersConfig, "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.vocab_size, 101);
  EXPECT_EQ(c.hidden_size, 16);
  EXPECT_EQ(c.intermediate_size, 32);
  EXPECT_EQ(c.num_hidden_layers, 1);
  EXPECT_EQ(c.num_attention_heads, 2);
  EXPECT_EQ(c.num_key_value_heads, 1);
  EXPECT_EQ(c.head_size(), 8);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, std::optional<int64_t>(1));
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.architecture(), "LlamaForCausalLM");
}

TEST(LlamaConfig, RopeThetaHeadDimAndDefaults) {
  // rope_parameters wins over the top-level key, which wins over the default.
  auto c = llama::from_hf_json(
      with(
          R"("rope_theta": 500000, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0})"),
      "t");
  EXPECT_DOUBLE_EQ(c.rope_theta, 100.0);
  EXPECT_DOUBLE_EQ(llama::from_hf_json(with(R"("rope_theta": 500000.0)"), "t").rope_theta, 5e5);
  c = llama::from_hf_json(with(""), "t");
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_EQ(c.head_size(), 8);  // 32 / 4
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-6);
  // head_dim given (not hidden / heads), or null.
  EXPECT_EQ(llama::from_hf_json(with(R"("head_dim": 24)"), "t").head_size(), 24);
  EXPECT_EQ(llama::from_hf_json(with(R"("head_dim": null)"), "t").head_size(), 8);
  // transformers 4's torch_dtype, Llama 3's list of eos ids, a rope_scaling of null.
  c = llama::from_hf_json(
      with(R"("torch_dtype": "bfloat16", "eos_token_id": [7, 9], "rope_scaling": null)"), "t");
  EXPECT_EQ(c.dtype, "bfloat16");
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{7, 9}));
  // Rotary scaling: Llama 3.1's file (transformers 4's rope_scaling beside a top-level
  // rope_theta), the original context defaulting to max_position_embeddings, "type" for
  // "rope_type", and rope_scaling taken whole over rope_parameters (as transformers 5.24 does).
  c = llama::from_hf_json(with(R"("rope_theta": 500000.0, "max_position_embeddings": 131072,
      "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192, "rope_type": "llama3"})"),
                          "t");
  EXPECT_DOUBLE_EQ(c.rope_theta, 5e5);
  EXPECT_EQ(c.rope_scaling, (llama::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192}));
  c = llama::from_hf_json(with(R"("max_position_embeddings": 512, "rope_parameters":
      {"rope_type": "llama3", "factor": 2, "low_freq_factor": 2, "high_freq_factor": 3})"),
                          "t");
  EXPECT_EQ(c.rope_scaling, (llama::RopeScaling{"llama3", 2.0, 2.0, 3.0, 512}));
  c = llama::from_hf_json(with(R"("rope_scaling": {"type": "linear", "factor": 2.5},
      "rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 7.0})"),
                          "t");
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  c = llama::from_hf_json(with(R"("rope_scaling": {}, "rope_parameters": {"rope_type": "linear",
      "factor": 4.0})"),
                          "t");
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_EQ(llama::from_hf_json(with(""), "t").rope_scaling, llama::RopeScaling{});
  // A top-level original_max_position_embeddings wins (transformers' standardize_rope_params),
  // and a whole number written as a float is one.
  c = llama::from_hf_json(with(R"("original_max_position_embeddings": 4096.0, "rope_scaling":
      {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4,
       "original_max_position_embeddings": 8192})"),
                          "t");
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 4096);
  // num_key_value_heads defaults to the heads (llama only).
  c = llama::from_hf_json(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
                          "t");
  EXPECT_EQ(c.num_key_value_heads, 2);
}

TEST(LlamaConfig, RoundTripsThroughConfigJson) {
  llama::Config c = tiny_llama(/*tied=*/true);
  c.head_dim = 20;
  c.rope_theta = 123456.5;
  c.attention_bias = true;
  c.mlp_bias = true;
  c.bos_token_id = std::nullopt;
  c.eos_token_ids = {3, 4};
  c.pad_token_id = 0;
  c.dtype = "bfloat16";
  c.max_position_embeddings = 77;
  auto text = llama::to_hf_json(c);
  auto back = llama::from_hf_json(text, "round trip");
  EXPECT_EQ(llama::to_hf_json(back), text);
  EXPECT_EQ(back.head_dim, 20);
  EXPECT_DOUBLE_EQ(back.rope_theta, 123456.5);
  EXPECT_TRUE(back.tie_word_embeddings && back.attention_bias && back.mlp_bias);
  EXPECT_FALSE(back.bos_token_id.has_value());
  EXPECT_EQ(back.eos_token_ids, (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(back.pad_token_id, std::optional<int64_t>(0));
  // What other readers need written explicitly (mlx_lm: a top-level rope_theta and
  // tie_word_embeddings; transformers 5: rope_parameters).
  for (const char* key :
       {R"("rope_theta": 123456.5)", R"("rope_parameters": {)", R"("rope_type": "default")",
        R"("tie_word_embeddings": true)", R"("architectures": [)", R"("LlamaForCausalLM")",
        R"("model_type": "llama")", R"("dtype": "bfloat16")", R"("head_dim": 20)"}) {
    EXPECT_NE(text.find(key), std::string::npos) << key << " not in\n" << text;
  }
  // Rotary scaling round-trips, written both as rope_parameters and as the rope_scaling mlx_lm
  // reads; none is written for the default type.
  EXPECT_EQ(text.find("rope_scaling"), std::string::npos);
  for (const auto& scaling : {llama::RopeScaling{"linear", 2.5, 1.0, 4.0, 0},
                              llama::RopeScaling{"llama3", 32.0, 1.5, 4.5, 100}}) {
    c.rope_scaling = scaling;
    text = llama::to_hf_json(c);
    back = llama::from_hf_json(text, "round trip");
    EXPECT_EQ(back.rope_scaling, scaling);
    EXPECT_EQ(llama::to_hf_json(back), text);
    EXPECT_NE(text.find(R"("rope_scaling": {)"), std::string::npos) << text;
    EXPECT_NE(text.find(R"("rope_type": ")" + scaling.type + "\""), std::string::npos) << text;
  }
  // The default head size is written too, as transformers does.
  EXPECT_NE(llama::to_hf_json(tiny_llama()).find(R"("head_dim": 14)"), std::string::npos);
}

TEST(LlamaConfig, RejectsWhatChangesTheMathByName) {
  const std::pair<std::string, std::string> cases[] = {
      {with(R"("rope_scaling": {"rope_type": "dynamic", "factor": 8.0})"),
       "rope type \"dynamic\" is not implemented"},
      {with(R"("rope_scaling": {"type": "longrope", "factor": 2.0})"), "rope type \"longrope\""},
      {with(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0})"),
       "\"rope_parameters\": rope type \"yarn\""},
      {with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})"),
       "rope type \"llama3\" needs \"low_freq_factor\""},
      {with(R"("rope_scaling": {"rope_type": "linear"})"), "rope type \"linear\" needs \"factor\""},
      {with(R"("rope_scaling": {"rope_type": "linear", "factor": "2"})"),
       "\"rope_scaling.factor\" is \"2\", expected a number"},
      {with(R"("rope_scaling": {"rope_type": "linear", "factor": 0})"),
       "rope factor is 0, expected > 0"},
      {with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 4,
               "high_freq_factor": 4})"),
       "low_freq_factor 4 and high_freq_factor 4, expected 0 < low < high"},
      {with(R"("rope_scaling": {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
               "high_freq_factor": 4, "original_max_position_embeddings": 8192.5})"),
       "\"rope_scaling.original_max_position_embeddings\" is 8192.5, expected an integer"},
      {with(R"("rope_scaling": {"rope_type": 3})"), "\"rope_scaling.rope_type\" is 3"},
      {with(R"("rope_scaling": {"rope_type": null, "type": "linear", "factor": 2})"),
       "\"rope_scaling.rope_type\" is null, expected a string"},
      {with(R"("rope_parameters": {"rope_type": "default", "rope_theta": null})"),
       "\"rope_parameters.rope_theta\" is null"},
      {with(R"("partial_rotary_factor": 0.5)"), "\"partial_rotary_factor\" is 0.5"},
      {with(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})"),
       "partial_rotary_factor 0.5"},
      {with(R"("sliding_window": 4096)"), "\"sliding_window\" is 4096"},
      {with("", "mistral"), "absent (mistral's default 4096)"},
      {with(R"("use_sliding_window": true)", "qwen2"), "\"use_sliding_window\" is true"},
      {with(R"("layer_types": ["full_attention", "sliding_attention"])", "qwen2"),
       "\"layer_types\"[1] is \"sliding_attention\""},
      {with(R"("hidden_act": "gelu")"), "\"hidden_act\" is \"gelu\""},
      {with(R"("pretraining_tp": 2)"), "\"pretraining_tp\" is 2"},
      {with(R"("attention_dropout": 0.1)"), "\"attention_dropout\" is 0.1"},
      {with("", "gemma"), "model_type \"gemma\" is not implemented"},
      {with(R"("num_attention_heads": 5)"),
       "hidden_size 32 does not divide by num_attention_heads 5"},
      {with(R"("num_key_value_heads": 3)"),
       "num_attention_heads 4 does not divide by num_key_value_heads 3"},
      {with(R"("head_dim": 7)"), "the head size 7 is odd"},
      {with(R"("vocab_size": "100")"), "\"vocab_size\" is \"100\", expected an integer"},
      {with(R"("hidden_size": 0)"), "hidden_size is 0, expected at least 1"},
      {with(R"("bos_token_id": 100)"), "bos_token_id 100 is outside the vocabulary of 100"},
      {with(R"("attention_bias": true, "sliding_window": null)", "mistral"),
       "mistral has no attention or MLP biases"},
      {R"({"model_type": "llama", "hidden_size": 8})", "no \"vocab_size\" (required)"},
      {R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
           "num_hidden_layers": 1, "num_attention_heads": 2})",
       "no \"num_key_value_heads\" (required)"},
  };
  for (const auto& [text, needle] : cases) {
    SCOPED_TRACE(text);
    expect_error_containing<InvalidArgument>([&] { llama::from_hf_json(text, "my/config.json"); },
                                             needle);
    expect_error_containing<InvalidArgument>([&] { llama::from_hf_json(text, "my/config.json"); },
                                             "my/config.json");
  }
  expect_error_containing<FormatError>([] { llama::from_hf_json("{not json", "bad.json"); },
                                       "bad.json: not valid JSON");
  expect_error_containing<FormatError>([] { llama::from_hf_json("[1, 2]", "list.json"); },
                                       "list.json: not a JSON object");
}

TEST(LlamaConfig, AcceptsTheRelativesWhoseMathIsLlamas) {
  auto m = llama::from_hf_json(with(R"("sliding_window": null, "head_dim": 16)", "mistral"), "m");
  EXPECT_EQ(m.architecture(), "MistralForCausalLM");
  EXPECT_FALSE(m.qkv_bias() || m.o_bias());
  auto q = llama::from_hf_json(with(R"("sliding_window": 4096, "use_sliding_window": false,
              "layer_types": ["full_attention", "full_attention"])",
                                    "qwen2"),
                               "q");
  EXPECT_EQ(q.architecture(), "Qwen2ForCausalLM");
  EXPECT_TRUE(q.qkv_bias());
  EXPECT_FALSE(q.o_bias());
  EXPECT_FALSE(q.bos_token_id.has_value());
  // The written config of each parses back to itself.
  for (const auto& c : {m, q}) {
    EXPECT_EQ(llama::to_hf_json(llama::from_hf_json(llama::to_hf_json(c), "again")),
              llama::to_hf_json(c));
  }
}

TEST(LlamaConfig, PresetsHaveThePublishedParameterCounts) {
  EXPECT_EQ(llama::parameter_count(*llama::preset_config("llama2-7b")), 6738415616);
  EXPECT_EQ(llama::parameter_count(*llama::preset_config("llama3-8b")), 8030261248);
  EXPECT_EQ(llama::parameter_count(*llama::preset_config("llama3-70b")), 70553706496);
  EXPECT_EQ(llama::parameter_count(*llama::preset_config("llama3.1-8b")), 8030261248);
  EXPECT_EQ(llama::preset_config("llama3.1-8b")->rope_scaling,
            (llama::RopeScaling{"llama3", 8.0, 1.0, 4.0, 8192}));
  EXPECT_EQ(llama::preset_config("llama3.1-8b")->max_position_embeddings, 131072);
  EXPECT_EQ(llama::parameter_count(*llama::preset_config("llama3.2-1b")), 1235814400);  // tied
  EXPECT_EQ(llama::preset_config("llama3.2-1b")->rope_scaling,
            (llama::RopeScaling{"llama3", 32.0, 1.0, 4.0, 8192}));
  EXPECT_FALSE(llama::preset_config("llama4").has_value());
  EXPECT_EQ(llama::preset_names().size(), 5u);
  for (const auto& name : llama::preset_names()) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(llama::validate(*llama::preset_config(name)));
  }
}

// The rotary angle of position 1 is each inverse frequency: checked against the scaling
// formulas evaluated in double (llama_config.h), at a size where llama3's three bands all occur
// (head 16, theta 10000: wavelengths 6.3, 19.9, 62.8, 199, ...; bands at 64/4 and 64/1).
TEST(LlamaConfig, RotaryScalingFollowsItsFormulas) {
  llama::Config c = tiny_llama();
  c.hidden_size = 64;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 4;
  c.head_dim = 16;
  c.rope_theta = 10000.0;
  auto inverse_frequencies = [&] {
    auto [cos, sin] = llama::rotary_cos_sin(c, 2, torch::kDouble, torch::kCPU);
    auto angle = torch::atan2(sin[0][1], cos[0][1]).slice(0, 0, 8);  // the two halves repeat
    return std::vector<double>(angle.data_ptr<double>(), angle.data_ptr<double>() + 8);
  };
  auto expect = [&](const std::function<double(double)>& scale) {
    auto got = inverse_frequencies();
    for (int i = 0; i < 8; ++i) {
      const double inv = std::pow(10000.0, -2.0 * i / 16);
      EXPECT_NEAR(got[i], scale(inv), 1e-6 * inv) << "i " << i;
    }
  };
  expect([](double inv) { return inv; });
  c.rope_scaling = {"linear", 4.0, 1.0, 4.0, 0};
  expect([](double inv) { return inv / 4; });
  c.rope_scaling = {"llama3", 8.0, 1.0, 4.0, 64};
  int bands[3] = {0, 0, 0};
  expect([&](double inv) {
    const double w = 2 * M_PI / inv;
    if (w < 64 / 4.0) {
      ++bands[0];
      return inv;
    }
    if (w > 64 / 1.0) {
      ++bands[2];
      return inv / 8;
    }
    ++bands[1];
    const double s = (64 / w - 1.0) / (4.0 - 1.0);
    return (1 - s) * inv / 8 + s * inv;
  });
  EXPECT_EQ(bands[0], 1);
  EXPECT_EQ(bands[1], 2);
  EXPECT_EQ(bands[2], 5);
}

TEST(LlamaConfig, ReadsAFileOrADirectory) {
  const std::string dir = scratch_path("config");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  {
    std::ofstream out(dir + "/config.json");
    out << kTransformersConfig;
  }
  EXPECT_EQ(llama::read_hf_config(dir).vocab_size, 101);
  EXPECT_EQ(llama::read_hf_config(dir + "/config.json").vocab_size, 101);
  expect_error_containing<InvalidArgument>([&] { llama::read_hf_config(dir + "/none.json"); },
                                           "cannot read the model config " + dir + "/none.json");
  remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing
