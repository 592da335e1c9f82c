// Hugging Face directories on thread ranks: saved sharded (small files) from a model sharded at
// one world size, loaded into a model sharded at another, every parameter bit for bit; hybrid
// sharding both ways; bf16 files; tied heads; tokenizer files; and every broken directory named on
// every rank, with nothing changed and nothing left behind.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <sstream>

#include "fsdp/fsdp.h"
#include "fsdp/models/hf_checkpoint.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

constexpr uint64_t kSeed = 21;

// The reference: the unsharded model's tensors under their state dict names.
FullStateDict reference_state(const llama::Config& c, uint64_t seed = kSeed) {
  auto model = build_seeded(c, seed);
  FullStateDict out;
  for (const auto& [name, s] : get_model_state_dict(*model)) out.emplace_back(name, s.local);
  return out;
}

// The model sharded layer by layer as it is built, then the root, over a group or a mesh
// (hybrid sharding). random_init false: every parameter left for a load to fill.
template <typename Group>
llama::LlamaForCausalLM sharded_model(const llama::Config& c, const Group& group, bool random_init,
                                      uint64_t seed = kSeed) {
  llama::BuildOptions o;
  o.random_init = random_init;
  o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) { fully_shard(layer, group); };
  auto model = build_seeded(c, seed, o);
  fully_shard(model, group);
  return model;
}

// Loads `dir` into a model sharded over `world` thread ranks and expects its full state dict
// to equal `want`, bit for bit.
void expect_loads_as(const std::string& dir, const llama::Config& c, int world,
                     const FullStateDict& want) {
  run_local_ranks(
      world,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded_model(c, pg, /*random_init=*/false);
        llama::load_hf_weights(dir, *model, pg);
        auto got = get_full_model_state_dict(*model, pg);
        if (pg->rank() == 0) expect_same_tensors(got, want);
      },
      test_options());
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// A directory saved at world 1 (one file, or shards under `max_shard_bytes`).
std::string saved_dir(const llama::Config& c, int64_t max_shard_bytes = 5'000'000'000) {
  const std::string dir = scratch_path("hf");
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, /*random_init=*/true);
    llama::HfSaveOptions o;
    o.max_shard_bytes = max_shard_bytes;
    llama::save_hf_checkpoint(dir, *model, c, pg, o);
  });
  return dir;
}

// Loads `dir` at world 1 into a model with other values and expects `needle` in a
// CheckpointError; the parameters must be unchanged.
void expect_load_error(const std::string& dir, const llama::Config& c, const std::string& needle) {
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, /*random_init=*/true, /*seed=*/99);
    auto before = get_full_model_state_dict(*model, pg);
    expect_error_containing<CheckpointError>([&] { llama::load_hf_weights(dir, *model, pg); },
                                             needle);
    expect_same_tensors(get_full_model_state_dict(*model, pg), before);
  });
}

bool has_temporary_sibling(const std::string& dir) {
  const auto slash = dir.find_last_of('/');
  const std::string base = dir.substr(slash + 1) + ".tmp-";
  for (const auto& name : list_dir(dir.substr(0, slash))) {
    if (name.compare(0, base.size(), base) == 0) return true;
  }
  return false;
}

struct Worlds {
  int save, load;
};

void PrintTo(const Worlds& w, std::ostream* os) {
  *os << "saved at world " << w.save << ", loaded at " << w.load;
}

class HfRoundTrip : public ::testing::TestWithParam<Worlds> {};

// Saved from a model sharded over `save` ranks into small files, loaded into one sharded over
// `load` ranks: every parameter bit for bit, every tensor in exactly one file.
TEST_P(HfRoundTrip, EveryParameterBitForBit) {
  const auto w = GetParam();
  for (bool tied : {false, true}) {
    auto c = tiny_llama(tied);
    c.attention_bias = true;  // 1-D tensors inside the layers too
    const auto want = reference_state(c);
    const std::string dir = scratch_path("roundtrip");
    llama::HfSaveOptions o;
    o.max_shard_bytes = 40'000;  // the embedding (224 KB) alone, layers over several files
    run_local_ranks(
        w.save,
        [&](const ProcessGroupPtr& pg) {
          auto model = sharded_model(c, pg, /*random_init=*/true);
          llama::save_hf_checkpoint(dir, *model, c, pg, o);
        },
        test_options());
    expect_loads_as(dir, c, w.load, want);
    // The files: each tensor once, under transformers' names (no lm_head.weight when tied),
    // each file within the limit unless it holds one tensor, {"format": "pt"} in each.
    auto files = llama::hf_weight_files(dir);
    EXPECT_GT(files.size(), 3u);
    std::multiset<std::string> names;
    for (const auto& f : files) {
      EXPECT_EQ(f.find("model-0000"), 0u) << f;
      auto index = read_safetensors_index(dir + "/" + f);
      EXPECT_EQ(index.metadata.at("format"), "pt");
      uint64_t bytes = 0;
      for (const auto& e : index.entries) {
        names.insert(e.name);
        bytes += e.nbytes;
      }
      EXPECT_TRUE(bytes <= 40'000 || index.entries.size() == 1) << f << " " << bytes;
    }
    auto expected = llama::parameter_names(c);
    EXPECT_EQ(names, std::multiset<std::string>(expected.begin(), expected.end()));
    EXPECT_EQ(names.count("lm_head.weight"), tied ? 0u : 1u);
    // config.json describes the model; generation_config.json has the token ids.
    auto back = llama::read_hf_config(dir);
    EXPECT_EQ(llama::to_hf_json(back), llama::to_hf_json(c));
    EXPECT_NE(read_file(dir + "/generation_config.json").find("\"eos_token_id\": 2"),
              std::string::npos);
    EXPECT_NE(read_file(dir + "/model.safetensors.index.json").find("\"total_size\""),
              std::string::npos);
    EXPECT_FALSE(has_temporary_sibling(dir));
    remove_all(dir);
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, HfRoundTrip,
                         ::testing::Values(Worlds{1, 3}, Worlds{2, 4}, Worlds{3, 1}, Worlds{4, 2},
                                           Worlds{3, 3}),
                         [](const ::testing::TestParamInfo<Worlds>& info) {
                           return "save" + std::to_string(info.param.save) + "_load" +
                                  std::to_string(info.param.load);
                         });

TEST(HfCheckpoint, Bf16FilesAndOneFile) {
  auto c = tiny_llama();
  const auto want = reference_state(c);
  const std::string dir = scratch_path("bf16");
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded_model(c, pg, /*random_init=*/true);
        llama::HfSaveOptions o;
        o.dtype = torch::kBFloat16;
        llama::save_hf_checkpoint(dir, *model, c, pg, o);
      },
      test_options());
  EXPECT_EQ(llama::hf_weight_files(dir), std::vector<std::string>{"model.safetensors"});
  EXPECT_FALSE(list_dir(dir).empty());
  for (const auto& e : read_safetensors_index(dir + "/model.safetensors").entries) {
    EXPECT_EQ(e.dtype, torch::kBFloat16) << e.name;
  }
  EXPECT_EQ(llama::read_hf_config(dir).dtype, "bfloat16");
  // Into fp32 parameters: the bf16 rounding of the reference, exactly.
  FullStateDict rounded;
  for (const auto& [n, t] : want) rounded.emplace_back(n, t.to(torch::kBFloat16).to(torch::kFloat));
  expect_loads_as(dir, c, 3, rounded);
  // Into bf16 parameters (converted on the way in).
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    llama::HfLoadOptions o;
    o.dtype = torch::kBFloat16;
    auto loaded = llama::load_hf_model(dir, pg, o);
    for (const auto& [n, s] : get_model_state_dict(*loaded.model)) {
      EXPECT_EQ(s.local.scalar_type(), torch::kBFloat16) << n;
    }
  });
  remove_all(dir);
}

// Hybrid sharding (2 replicas x 2 shards at world 4): saved, the files hold exactly what a
// plain save holds (each tensor once, bit for bit: replica 0's rows, not one copy per
// replica); loaded, every replica gets the whole model.
TEST(HfCheckpoint, HybridShardedSavesAndLoads) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    auto c = tiny_llama(tied);
    const auto want = reference_state(c);
    const std::string dir = scratch_path("hybrid");
    llama::HfSaveOptions o;
    o.max_shard_bytes = 40'000;
    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& pg) {
          auto mesh = make_device_mesh(pg, 2);
          auto model = sharded_model(c, mesh, /*random_init=*/true);
          // Replica 1's rows made different: only replica 0's may reach the files.
          if (mesh.replicate->rank() == 1) {
            torch::NoGradGuard no_grad;
            for (auto& [name, shard] : get_model_state_dict(*model)) shard.local.add_(1);
          }
          llama::save_hf_checkpoint(dir, *model, c, pg, o);
        },
        test_options());
    const std::string plain = scratch_path("plain");
    run_local_ranks(
        2,
        [&](const ProcessGroupPtr& pg) {
          auto model = sharded_model(c, pg, /*random_init=*/true);
          llama::save_hf_checkpoint(plain, *model, c, pg, o);
        },
        test_options());
    auto files = llama::hf_weight_files(dir);
    ASSERT_EQ(files, llama::hf_weight_files(plain));
    for (const auto& f : files)
      EXPECT_EQ(read_file(dir + "/" + f), read_file(plain + "/" + f)) << f;
    // Into a plain model at world 3, and into each replica of a hybrid model.
    expect_loads_as(dir, c, 3, want);
    run_local_ranks(
        4,
        [&](const ProcessGroupPtr& pg) {
          auto mesh = make_device_mesh(pg, 2);
          auto model = sharded_model(c, mesh, /*random_init=*/false);
          llama::load_hf_weights(plain, *model, pg);
          // Each rank's own rows, in both replicas (a gather could read replica 0 only).
          int checked = 0;
          for (const auto& [name, shard] : get_model_state_dict(*model)) {
            for (const auto& [want_name, full] : want) {
              if (want_name != name) continue;
              EXPECT_EQ(shard.replica, mesh.replicate->rank()) << name;
              auto rows = shard.replicated ? full : full.narrow(0, shard.row_offset, shard.rows());
              EXPECT_TRUE(torch::equal(shard.local, rows)) << name << " on rank " << pg->rank();
              ++checked;
            }
          }
          EXPECT_EQ(checked, static_cast<int>(want.size()));
        },
        test_options());
    remove_all(dir);
    remove_all(plain);
  }
}

TEST(HfCheckpoint, LoadHfModelShardsAsItBuilds) {
  auto c = tiny_llama(/*tied=*/true);
  const auto want = reference_state(c);
  const std::string dir = saved_dir(c, 50'000);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        llama::HfLoadOptions o;
        int layers = 0;
        o.on_layer_built = [&](int64_t, Unit<llama::DecoderLayer>& layer) {
          ++layers;
          fully_shard(layer, pg);
        };
        o.on_model_built = [&](llama::LlamaForCausalLM& model) { fully_shard(model, pg); };
        auto loaded = llama::load_hf_model(dir, pg, o);
        EXPECT_EQ(layers, 2);
        EXPECT_TRUE(loaded.config.tie_word_embeddings);
        // Each rank holds only its rows of the embedding (1001 rows over 2 ranks).
        EXPECT_EQ(loaded.model->model->embed_tokens->weight.size(0), pg->rank() == 0 ? 501 : 500);
        auto got = get_full_model_state_dict(*loaded.model, pg);
        if (pg->rank() == 0) expect_same_tensors(got, want);
      },
      test_options());
  remove_all(dir);
}

TEST(HfCheckpoint, TiedModelAcceptsAFileWithTheHead) {
  auto c = tiny_llama(/*tied=*/true);
  const std::string dir = saved_dir(c);
  const std::string file = dir + "/model.safetensors";
  auto tensors = read_safetensors(file);
  at::Tensor embed;
  for (const auto& [n, t] : tensors) {
    if (n == "model.embed_tokens.weight") embed = t;
  }
  tensors.emplace_back("lm_head.weight", embed);
  tensors.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", torch::ones({7}));
  write_safetensors(file, tensors);
  const auto want = reference_state(c);
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, /*random_init=*/false);
    llama::load_hf_weights(dir, *model, pg);
    expect_same_tensors(get_full_model_state_dict(*model, pg), want);
  });
  // An untied model needs its head.
  const std::string tied_dir = saved_dir(tiny_llama(true));
  expect_load_error(tied_dir, tiny_llama(false), "missing tensors: 'lm_head.weight' [1001, 56]");
  remove_all(dir);
  remove_all(tied_dir);
}

// As transformers' from_pretrained: model.safetensors wins over an index beside it.
TEST(HfCheckpoint, OneFileWinsOverAnIndex) {
  auto c = tiny_llama();
  const std::string sharded = saved_dir(c, 40'000), single = saved_dir(c);
  EXPECT_GT(llama::hf_weight_files(sharded).size(), 1u);
  write_file(sharded + "/model.safetensors", read_file(single + "/model.safetensors"));
  EXPECT_EQ(llama::hf_weight_files(sharded + "/"), std::vector<std::string>{"model.safetensors"});
  const auto want = reference_state(c);
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, /*random_init=*/false);
    llama::load_hf_weights(sharded, *model, pg);
    expect_same_tensors(get_full_model_state_dict(*model, pg), want);
  });
  remove_all(sharded);
  remove_all(single);
}

TEST(HfCheckpoint, TokenizerFilesAreCopied) {
  auto c = tiny_llama();
  const std::string tok = scratch_path("tok");
  ASSERT_EQ(::mkdir(tok.c_str(), 0755), 0);
  write_file(tok + "/tokenizer.model", std::string("\x0a\x03spm\x00\xff", 7));
  write_file(tok + "/tokenizer_config.json", "{\"add_bos_token\": true}\n");
  write_file(tok + "/unrelated.txt", "not a tokenizer file");
  const std::string extra = scratch_path("extra") + "_special_tokens_map.json";
  write_file(extra, "{}");
  const std::string dir = scratch_path("withtok");
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, true);
    llama::HfSaveOptions o;
    o.tokenizer_files = {tok, extra};
    llama::save_hf_checkpoint(dir, *model, c, pg, o);
  });
  EXPECT_EQ(read_file(dir + "/tokenizer.model"), read_file(tok + "/tokenizer.model"));
  EXPECT_EQ(read_file(dir + "/tokenizer_config.json"), read_file(tok + "/tokenizer_config.json"));
  const auto extra_name = extra.substr(extra.find_last_of('/') + 1);
  EXPECT_EQ(read_file(dir + "/" + extra_name), "{}");
  auto names = list_dir(dir);
  EXPECT_EQ(std::count(names.begin(), names.end(), "unrelated.txt"), 0);
  // A missing tokenizer file fails before anything is written.
  const std::string dir2 = scratch_path("withtok2");
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, true);
    llama::HfSaveOptions o;
    o.tokenizer_files = {tok + "/nope.model"};
    expect_error_containing<CheckpointError>(
        [&] { llama::save_hf_checkpoint(dir2, *model, c, pg, o); },
        "tokenizer file " + tok + "/nope.model does not exist");
  });
  EXPECT_FALSE(has_temporary_sibling(dir2));
  EXPECT_TRUE(list_dir(dir2).empty());
  for (const auto& p : {tok, dir, extra}) remove_all(p);
}

TEST(HfCheckpoint, BrokenDirectoriesAreNamed) {
  auto c = tiny_llama();
  auto edit = [&](const std::string& dir, const std::function<void(NamedTensors&)>& change) {
    auto tensors = read_safetensors(dir + "/model.safetensors");
    change(tensors);
    write_safetensors(dir + "/model.safetensors", tensors);
  };
  auto drop = [](NamedTensors& t, const std::string& name) {
    t.erase(std::remove_if(t.begin(), t.end(), [&](const auto& kv) { return kv.first == name; }),
            t.end());
  };
  // Missing, unexpected, mis-shaped and non-float tensors, all named in one message.
  std::string dir = saved_dir(c);
  edit(dir, [&](NamedTensors& t) {
    drop(t, "model.norm.weight");
    drop(t, "model.layers.1.mlp.up_proj.weight");
    t.emplace_back("model.layers.7.mlp.extra.weight", torch::zeros({3, 3}));
    for (auto& [n, v] : t) {
      if (n == "model.layers.0.input_layernorm.weight") v = torch::ones({55});
      if (n == "model.layers.0.post_attention_layernorm.weight") v = torch::ones({56}, torch::kInt);
    }
  });
  for (const std::string& needle : std::vector<std::string>{
           "4 problems",
           "missing tensors: 'model.layers.1.mlp.up_proj.weight' [90, 56], "
           "'model.norm.weight' [56]",
           "tensors the model does not have: 'model.layers.7.mlp.extra.weight'",
           "'model.layers.0.input_layernorm.weight' has shape [55] in " + dir +
               "/model.safetensors; the model's is [56]",
           "'model.layers.0.post_attention_layernorm.weight' is Int in"}) {
    expect_load_error(dir, c, needle);
  }
  remove_all(dir);

  // A shard file missing, and one truncated.
  dir = saved_dir(c, 40'000);
  auto files = llama::hf_weight_files(dir);
  ASSERT_GE(files.size(), 3u);
  std::remove((dir + "/" + files[1]).c_str());
  expect_load_error(dir, c, "missing file " + dir + "/" + files[1] + " (the index puts");
  remove_all(dir);
  dir = saved_dir(c, 40'000);
  const std::string victim = dir + "/" + files[2];
  ASSERT_EQ(::truncate(victim.c_str(), static_cast<off_t>(read_file(victim).size() / 2)), 0);
  expect_load_error(dir, c, "safetensors file " + victim);
  expect_load_error(dir, c, "(truncated file?)");
  // An index naming a tensor its file does not hold.
  write_file(dir + "/model.safetensors.index.json",
             "{\"weight_map\": {\"model.norm.weight\": \"" + files[0] + "\"}}");
  expect_load_error(
      dir, c, "the index puts 'model.norm.weight' in " + files[0] + ", which does not hold it");
  remove_all(dir);
  // Not a model directory at all.
  expect_load_error("/nonexistent/model", c,
                    "/nonexistent/model holds neither model.safetensors nor "
                    "model.safetensors.index.json");
}

TEST(HfCheckpoint, ErrorsAreDecidedOnEveryRank) {
  auto c = tiny_llama();
  const std::string dir = saved_dir(c);
  auto tensors = read_safetensors(dir + "/model.safetensors");
  tensors.erase(tensors.begin());  // model.embed_tokens.weight
  write_safetensors(dir + "/model.safetensors", tensors);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded_model(c, pg, true, 5);
        expect_error_containing<CheckpointError>(
            [&] { llama::load_hf_weights(dir, *model, pg); },
            "rank 0: missing tensors: 'model.embed_tokens.weight' [1001, 56]; rank 1: missing");
      },
      test_options());
  remove_all(dir);
}

TEST(HfCheckpoint, SaveRefusesToOverwriteAndChecksTheConfig) {
  auto c = tiny_llama();
  const std::string dir = scratch_path("existing");
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  write_file(dir + "/notes.txt", "mine");
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = sharded_model(c, pg, true);
        expect_error_containing<CheckpointError>(
            [&] { llama::save_hf_checkpoint(dir, *model, c, pg); },
            "exists and is not an empty directory: nothing a user saved is overwritten");
        // The config of another model: tied, while the model has a head of its own.
        expect_error_containing<CheckpointError>(
            [&] { llama::save_hf_checkpoint(dir + "_other", *model, tiny_llama(true), pg); },
            "the model does not match the config (LlamaForCausalLM): 'lm_head.weight' is not a "
            "tensor of this config");
      },
      test_options());
  EXPECT_EQ(read_file(dir + "/notes.txt"), "mine");
  EXPECT_EQ(list_dir(dir).size(), 1u);
  EXPECT_FALSE(has_temporary_sibling(dir));
  EXPECT_TRUE(list_dir(dir + "_other").empty());
  // An empty directory is taken.
  remove_all(dir);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  run_local_ranks(1, [&](const ProcessGroupPtr& pg) {
    auto model = sharded_model(c, pg, true);
    llama::save_hf_checkpoint(dir + "/", *model, c, pg);
  });
  EXPECT_EQ(llama::hf_weight_files(dir), std::vector<std::string>{"model.safetensors"});
  remove_all(dir);
}

}  // namespace
}  // namespace fsdp::testing
