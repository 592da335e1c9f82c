// Sharded checkpoints over thread ranks: saved at world 4 and loaded at 1, 2 and 3 (parameters
// and AdamW state equal, frozen parameters and nested units included); atomic directories and
// keep-last; every corruption fails on every rank before anything changes.
#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/io/safetensors.h"
#include "support/expect_error.h"
#include "support/torch_api.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

// POSIX and the shell rather than std::filesystem: libtorch.so exports its own copies of
// std::filesystem's functions, and its remove_all crashes (docs/libtorch.md).
void remove_tree(const std::string& path) {
  ASSERT_EQ(std::system(("rm -rf '" + path + "'").c_str()), 0);
}

std::string fresh_dir(const std::string& name) {
  auto dir = "/tmp/fsdp_ckpt_" + name + "_" + std::to_string(::getpid());
  remove_tree(dir);
  return dir;
}

std::vector<std::string> list_names(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      if (n != "." && n != "..") names.push_back(n);
    }
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_size : -1;
}

// A model of `spec` sharded over `pg`, AdamW over it, `steps` steps on its slices.
struct Trained {
  TinyLM model{nullptr};
  std::unique_ptr<Unit<TinyLM>> root;
  std::unique_ptr<torch::optim::AdamW> opt;
};

Trained train(const TrainSpec& spec, const ProcessGroupPtr& pg, int steps) {
  Trained t;
  t.model = build_model(spec);
  t.root = std::make_unique<Unit<TinyLM>>(shard_model(t.model, pg, spec));
  t.opt = std::make_unique<torch::optim::AdamW>(t.root->parameters(),
                                                torch::optim::AdamWOptions(spec.lr));
  const int64_t local = spec.batch / pg->size();
  for (int step = 0; step < steps; ++step) {
    auto [tokens, targets] = global_batch(spec, step);
    t.opt->zero_grad();
    loss_of((*t.root)(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
            spec.model.output_size())
        .backward();
    t.opt->step();
  }
  return t;
}

// Every parameter and AdamW moment, gathered to full tensors, by name (collective).
std::map<std::string, at::Tensor> full_state(Trained& t, const ProcessGroupPtr& pg) {
  std::map<std::string, at::Tensor> out;
  auto& states = t.opt->state();
  for (const auto& item : t.model->named_parameters()) {
    const auto& p = item.value();
    // The full first dimension: sum of the rows of every rank.
    auto rows = at::full({1}, p.size(0), at::kLong);
    pg->all_reduce(rows, ReduceOp::kSum)->wait();
    const int64_t d0 = rows.item<int64_t>();
    out[item.key()] = gather_full(pg, p, d0);
    auto it = states.find(p.unsafeGetTensorImpl());
    const bool has = it != states.end();
    auto flag = at::full({1}, has ? 1 : 0, at::kLong);
    pg->all_reduce(flag, ReduceOp::kSum)->wait();
    if (flag.item<int64_t>() == 0) continue;
    auto& s = static_cast<torch::optim::AdamWParamState&>(*it->second);
    out[item.key() + "#exp_avg"] = gather_full(pg, s.exp_avg(), d0);
    out[item.key() + "#exp_avg_sq"] = gather_full(pg, s.exp_avg_sq(), d0);
    out[item.key() + "#step"] = at::full({1}, s.step(), at::kLong);
  }
  return out;
}

void expect_same(const std::map<std::string, at::Tensor>& got,
                 const std::map<std::string, at::Tensor>& want, const std::string& label) {
  ASSERT_EQ(got.size(), want.size()) << label;
  for (const auto& [name, t] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << label << ": " << name;
    EXPECT_TRUE(at::equal(it->second, t)) << label << ": " << name;
  }
}

TrainSpec checkpoint_spec() {
  TrainSpec spec;
  spec.steps = 3;
  // A frozen parameter: saved, no optimizer state.
  spec.edit_model = [](TinyLM& m) { m->layers[0]->norm1->weight.set_requires_grad(false); };
  return spec;
}

TEST(Checkpoint, SavedAtFourLoadsAtOneTwoAndThree) {
  const auto dir = fresh_dir("reshard");
  TrainSpec spec = checkpoint_spec();
  std::map<std::string, at::Tensor> saved;
  std::string path;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 3);
        auto state = full_state(t, pg);
        SaveOptions options;
        options.metadata["data_step"] = "3";
        auto p = save_checkpoint(dir, 3, *t.model, t.opt.get(), pg, options);
        if (pg->rank() == 0) saved = state, path = p;
      },
      test_options());
  ASSERT_EQ(latest_checkpoint(dir), path);
  for (int world : {1, 2, 3}) {
    run_local_ranks(
        world,
        [&](const ProcessGroupPtr& pg) {
          TrainSpec other = spec;
          other.seed = 99;  // different values: the load must overwrite every one
          auto t = train(other, pg, 1);
          auto info = load_checkpoint(path, *t.model, t.opt.get(), pg);
          EXPECT_EQ(info.step, 3);
          EXPECT_EQ(info.world_size, 4);
          EXPECT_EQ(info.metadata["data_step"], "3");
          auto state = full_state(t, pg);
          if (pg->rank() == 0) expect_same(state, saved, "world " + std::to_string(world));
        },
        test_options());
  }
  remove_tree(dir);
}

// Export at world 3 (uneven rows), read back whole; import at world 2, each rank its rows.
TEST(WholeModel, ExportAtThreeImportAtTwo) {
  const auto dir = fresh_dir("export");
  ::mkdir(dir.c_str(), 0755);
  const std::string file = dir + "/model.safetensors";
  TrainSpec spec = checkpoint_spec();
  std::map<std::string, at::Tensor> trained;
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 2);
        auto state = full_state(t, pg);
        export_safetensors(file, *t.model, pg);
        if (pg->rank() == 0) trained = state;
      },
      test_options());
  auto exported = read_safetensors(file);
  ASSERT_EQ(exported.size(), build_model(spec)->named_parameters().size());
  for (const auto& [name, t] : exported) EXPECT_TRUE(at::equal(t, trained.at(name))) << name;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec other = spec;
        other.seed = 7;
        auto model = build_model(other);
        shard_model(model, pg);
        load_safetensors_sharded(file, *model, pg);
        for (const auto& item : model->named_parameters()) {
          auto full = gather_full(pg, item.value(), trained.at(item.key()).size(0));
          if (pg->rank() == 0) {
            EXPECT_TRUE(at::equal(full, trained.at(item.key()))) << item.key();
          }
        }
        // A file of another model: refused on every rank, nothing changed.
        TrainSpec wider = spec;
        wider.model.dim = 64;
        auto other_model = build_model(wider);
        shard_model(other_model, pg);
        expect_error_containing<CheckpointError>(
            [&] { load_safetensors_sharded(file, *other_model, pg); },
            "tensor 'embed.weight' has shape [1001, 60]");
      },
      test_options());
  remove_tree(dir);
}

TEST(Checkpoint, KeepsTheLastKAndIgnoresUnfinishedSaves) {
  const auto dir = fresh_dir("keep");
  TrainSpec spec = checkpoint_spec();
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 1);
        SaveOptions keep2;
        keep2.keep_last = 2;
        for (int step = 1; step <= 4; ++step) {
          save_checkpoint(dir, step, *t.model, t.opt.get(), pg, keep2);
        }
        if (pg->rank() == 0) {
          // What a crash leaves: a save's staging directory, a removal's renamed checkpoint.
          ::mkdir((dir + "/.tmp-step_0000000009").c_str(), 0755);
          ::mkdir((dir + "/.tmp-removing-step_0000000002").c_str(), 0755);
          // A user's: a copy named like a checkpoint but not one of ours, a note, a directory
          // without manifest below the newest checkpoint.
          ASSERT_EQ(
              std::system(("cp -a '" + dir + "/step_0000000003' '" + dir + "/step_0000000099_best'")
                              .c_str()),
              0);
          std::ofstream(dir + "/.tmp-notes") << "mine";
          ::mkdir((dir + "/step_0000000000").c_str(), 0755);
          ::mkdir((dir + "/step_5").c_str(), 0755);  // not a name of ours: not "damaged"
        }
        pg->barrier()->wait();
        EXPECT_EQ(latest_checkpoint(dir), dir + "/step_0000000004");
        pg->barrier()->wait();
        // Never overwritten: the same step again is refused on every rank.
        expect_error_containing<CheckpointError>(
            [&] { save_checkpoint(dir, 4, *t.model, t.opt.get(), pg); }, "already exists");
        save_checkpoint(dir, 5, *t.model, t.opt.get(), pg, keep2);
        pg->barrier()->wait();
        if (pg->rank() == 0) {
          EXPECT_EQ(list_names(dir), (std::vector<std::string>{".tmp-notes", "step_0000000000",
                                                               "step_0000000004", "step_0000000005",
                                                               "step_0000000099_best", "step_5"}));
        }
        pg->barrier()->wait();
        // A later step's checkpoint (another run's) stays, and the one just saved is kept:
        // retention counts the earlier steps only.
        save_checkpoint(dir, 10, *t.model, t.opt.get(), pg);
        save_checkpoint(dir, 6, *t.model, t.opt.get(), pg, keep2);
        pg->barrier()->wait();
        if (pg->rank() == 0) {
          EXPECT_EQ(list_names(dir),
                    (std::vector<std::string>{".tmp-notes", "step_0000000000", "step_0000000005",
                                              "step_0000000006", "step_0000000010",
                                              "step_0000000099_best", "step_5"}));
        }
        EXPECT_EQ(latest_checkpoint(dir), dir + "/step_0000000010");
        pg->barrier()->wait();
        // A newer step directory without its manifest was damaged: an error, not a silent
        // resume from step 10.
        if (pg->rank() == 0) ::mkdir((dir + "/step_0000000011").c_str(), 0755);
        pg->barrier()->wait();
        expect_error_containing<CheckpointError>(
            [&] { latest_checkpoint(dir); },
            "step_0000000011 has no manifest.json: the newest checkpoint of");
      },
      test_options());
  EXPECT_EQ(latest_checkpoint(dir + "/absent"), std::nullopt);
  remove_tree(dir);
}

// SGD's momentum buffers reshard like AdamW's moments: saved at 3, loaded at 2.
TEST(Checkpoint, SgdMomentumReshards) {
  const auto dir = fresh_dir("sgd");
  TrainSpec spec;
  std::map<std::string, at::Tensor> saved;
  std::string path;
  auto sgd_run = [&](const ProcessGroupPtr& pg, Unit<TinyLM>& root, int steps) {
    auto opt = std::make_unique<torch::optim::SGD>(root.parameters(),
                                                   torch::optim::SGDOptions(0.1).momentum(0.9));
    const int64_t local = spec.batch / pg->size();
    for (int step = 0; step < steps; ++step) {
      auto [tokens, targets] = global_batch(spec, step);
      opt->zero_grad();
      loss_of(root(rank_slice(tokens, pg, local)), rank_slice(targets, pg, local),
              spec.model.output_size())
          .backward();
      opt->step();
    }
    return opt;
  };
  auto momenta = [&](const ProcessGroupPtr& pg, TinyLM& model, torch::optim::SGD& opt) {
    std::map<std::string, at::Tensor> out;
    for (const auto& item : model->named_parameters()) {
      auto rows = at::full({1}, item.value().size(0), at::kLong);
      pg->all_reduce(rows, ReduceOp::kSum)->wait();
      auto& st = static_cast<torch::optim::SGDParamState&>(
          *opt.state().at(item.value().unsafeGetTensorImpl()));
      out[item.key()] = gather_full(pg, st.momentum_buffer(), rows.item<int64_t>());
    }
    return out;
  };
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        auto root = shard_model(model, pg);
        auto opt = sgd_run(pg, root, 2);
        auto m = momenta(pg, model, *opt);
        auto p = save_checkpoint(dir, 2, *model, opt.get(), pg);
        if (pg->rank() == 0) saved = m, path = p;
      },
      test_options());
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto model = build_model(spec);
        auto root = shard_model(model, pg);
        auto opt = sgd_run(pg, root, 1);
        load_checkpoint(path, *model, opt.get(), pg);
        auto m = momenta(pg, model, *opt);
        if (pg->rank() == 0) expect_same(m, saved, "sgd momentum");
        // An AdamW cannot take SGD's state.
        torch::optim::AdamW adamw(root.parameters());
        expect_error_containing<CheckpointError>([&] { load_checkpoint(path, *model, &adamw, pg); },
                                                 "optimizer 'sgd', not of 'adamw'");
      },
      test_options());
  remove_tree(dir);
}

// SaveOptions::filter / LoadOptions::filter, as a LoRA run uses them: only the first block
// trains (the "adapters"), the rest is frozen and comes from elsewhere on resume.
bool first_block(const std::string& name) { return name.rfind("layers.0.", 0) == 0; }

TrainSpec partly_frozen_spec() {
  TrainSpec spec;
  spec.edit_model = [](TinyLM& m) {
    for (auto& item : m->named_parameters()) {
      if (!first_block(item.key())) item.value().set_requires_grad(false);
    }
  };
  return spec;
}

TEST(Checkpoint, FilteredSaveHoldsTheTrainablePartAndLoadsAtAnotherWorld) {
  const auto dir = fresh_dir("filtered");
  const auto full_dir = fresh_dir("filtered_full");
  TrainSpec spec = partly_frozen_spec();
  std::map<std::string, at::Tensor> saved;
  std::string path, full_path;
  run_local_ranks(
      4,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 3);
        auto state = full_state(t, pg);
        SaveOptions options;
        options.filter = first_block;
        auto p = save_checkpoint(dir, 3, *t.model, t.opt.get(), pg, options);
        auto f = save_checkpoint(full_dir, 3, *t.model, t.opt.get(), pg);
        if (pg->rank() == 0) saved = state, path = p, full_path = f;
      },
      test_options());
  // The manifest holds the first block and its AdamW state, nothing of the frozen rest.
  std::ifstream in(path + "/manifest.json");
  const std::string manifest((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  EXPECT_NE(manifest.find("\"partial\": true"), std::string::npos);
  EXPECT_NE(manifest.find("layers.0.attn.in_proj_weight#exp_avg"), std::string::npos);
  EXPECT_EQ(manifest.find("embed.weight"), std::string::npos);
  EXPECT_EQ(manifest.find("layers.1."), std::string::npos);
  EXPECT_LT(file_size(path + "/rank_00000.bin"), file_size(full_path + "/rank_00000.bin"));

  // Loaded at world 2 into a model of other values: the first block and its state as saved,
  // the rest as it was. The same from the full checkpoint with the same filter.
  for (const auto& from : {path, full_path}) {
    run_local_ranks(
        2,
        [&](const ProcessGroupPtr& pg) {
          TrainSpec other = spec;
          other.seed = 99;
          auto t = train(other, pg, 1);
          auto before = full_state(t, pg);
          LoadOptions options;
          options.filter = first_block;
          auto info = load_checkpoint(from, *t.model, t.opt.get(), pg, options);
          EXPECT_EQ(info.partial, from == path);
          auto after = full_state(t, pg);
          if (pg->rank() != 0) return;
          ASSERT_EQ(after.size(), saved.size());
          for (const auto& [name, value] : after) {
            const auto& want = first_block(name) ? saved.at(name) : before.at(name);
            EXPECT_TRUE(at::equal(value, want)) << from << ": " << name;
          }
        },
        test_options());
  }
  // Into a model that trains every parameter: the first block and its state from the
  // checkpoint, every other parameter and its AdamW state as they were.
  run_local_ranks(
      3,
      [&](const ProcessGroupPtr& pg) {
        TrainSpec all_trainable;
        all_trainable.seed = 99;
        auto t = train(all_trainable, pg, 2);
        auto before = full_state(t, pg);
        LoadOptions options;
        options.filter = first_block;
        load_checkpoint(path, *t.model, t.opt.get(), pg, options);
        auto after = full_state(t, pg);
        if (pg->rank() != 0) return;
        ASSERT_EQ(after.size(), before.size());
        int kept = 0;
        for (const auto& [name, value] : after) {
          const bool loaded = first_block(name);
          EXPECT_TRUE(at::equal(value, loaded ? saved.at(name) : before.at(name))) << name;
          kept += !loaded && name.find("#exp_avg") != std::string::npos;
        }
        EXPECT_GT(kept, 0) << "the excluded parameters had AdamW state to keep";
      },
      test_options());
  // Without the filter the partial checkpoint is refused, naming the fix; nothing changes.
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 1);
        auto before = full_state(t, pg);
        expect_error_containing<CheckpointError>(
            [&] { load_checkpoint(path, *t.model, t.opt.get(), pg); },
            "it is a partial checkpoint (saved with SaveOptions::filter)");
        auto after = full_state(t, pg);
        if (pg->rank() == 0) expect_same(after, before, "refused partial load: unchanged");
      },
      test_options());
  // A filter that leaves out a parameter the optimizer updates: refused, nothing written.
  run_local_ranks(
      1,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 1);
        SaveOptions options;
        options.filter = [](const std::string& name) { return name.rfind("layers.0.ffn", 0) == 0; };
        expect_error_containing<InvalidArgument>(
            [&] { save_checkpoint(dir, 7, *t.model, t.opt.get(), pg, options); },
            "which the optimizer updates");
      },
      test_options());
  EXPECT_EQ(latest_checkpoint(dir), path) << "the refused save wrote nothing";
  remove_tree(dir);
  remove_tree(full_dir);
}

TEST(Checkpoint, UnsupportedOptimizerFailsBeforeWriting) {
  // LBFGS keeps one state for all parameters at once: it cannot be split by rows.
  const auto dir = fresh_dir("lbfgs");
  TrainSpec spec;
  auto model = build_model(spec);
  auto pg = make_local_groups(1).front();
  auto root = shard_model(model, pg);
  torch::optim::LBFGS opt(root.parameters());
  expect_error_containing<CheckpointError>([&] { save_checkpoint(dir, 1, *model, &opt, pg); },
                                           "torch::optim::LBFGS");
  EXPECT_EQ(file_size(dir), -1) << "nothing created";
}

// Saves a 2-rank checkpoint, lets `damage` change it, then expects loading at 2 ranks to fail
// on both with `needle` and to leave parameters and optimizer state as they were.
void expect_load_fails(const std::string& label,
                       const std::function<void(const std::string&)>& damage,
                       const std::string& needle, TrainSpec load_spec = checkpoint_spec()) {
  const auto dir = fresh_dir(label);
  TrainSpec spec = checkpoint_spec();
  std::string path;
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 2);
        auto p = save_checkpoint(dir, 2, *t.model, t.opt.get(), pg);
        if (pg->rank() == 0) path = p;
      },
      test_options());
  damage(path);
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(load_spec, pg, 1);
        auto before = full_state(t, pg);
        expect_error_containing<CheckpointError>(
            [&] { load_checkpoint(path, *t.model, t.opt.get(), pg); }, needle);
        auto after = full_state(t, pg);
        if (pg->rank() == 0) expect_same(after, before, label + ": unchanged");
      },
      test_options());
  remove_tree(dir);
}

TEST(CheckpointErrors, TruncatedFile) {
  expect_load_fails(
      "truncated",
      [](const std::string& p) {
        const auto f = p + "/rank_00001.bin";
        ASSERT_EQ(::truncate(f.c_str(), file_size(f) / 2), 0);
      },
      "rank_00001.bin is truncated");
}

TEST(CheckpointErrors, CorruptedByte) {
  expect_load_fails(
      "corrupted",
      [](const std::string& p) {
        std::fstream f(p + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(100);
        char c = 0;
        f.read(&c, 1);
        c = static_cast<char>(c ^ 0x5a);
        f.seekp(100);
        f.write(&c, 1);
      },
      "checksum mismatch in tensor 'embed.weight'");
}

TEST(CheckpointErrors, MissingFile) {
  expect_load_fails(
      "missing", [](const std::string& p) { ::unlink((p + "/rank_00000.bin").c_str()); },
      "rank_00000.bin (tensor 'embed.weight')");
}

TEST(CheckpointErrors, MalformedManifest) {
  expect_load_fails(
      "manifest",
      [](const std::string& p) { std::ofstream(p + "/manifest.json") << "{\"format\": 3"; },
      "not valid JSON");
}

// Rewrites `p`'s manifest with `edit` applied to its text.
void edit_manifest(const std::string& p, const std::function<std::string(std::string)>& edit) {
  std::ifstream in(p + "/manifest.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  std::ofstream(p + "/manifest.json", std::ios::trunc) << edit(text);
}

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  if (at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The manifest's own line "manifest_crc32": N, gone: a manifest written before it existed.
std::string without_crc(std::string text) {
  const auto at = text.find("\"manifest_crc32\"");
  EXPECT_NE(at, std::string::npos);
  if (at == std::string::npos) return text;
  const auto begin = text.rfind('\n', at);
  return text.erase(begin, text.find('\n', at) - begin);
}

// One digit of the step changed: a silently different resume without the manifest's CRC.
TEST(CheckpointErrors, EditedManifest) {
  expect_load_fails(
      "edited",
      [](const std::string& p) {
        edit_manifest(p, [](std::string t) { return replaced(t, "\"step\": 2,", "\"step\": 1,"); });
      },
      "checksum mismatch: the manifest was changed or damaged");
}

// Without the CRC (an older manifest), the directory's name still catches a wrong step.
TEST(CheckpointErrors, StepUnlikeItsDirectory) {
  expect_load_fails(
      "stepname",
      [](const std::string& p) {
        edit_manifest(p, [](std::string t) {
          return replaced(without_crc(t), "\"step\": 2,", "\"step\": 1,");
        });
      },
      "says step 1, its directory's name step 2");
}

// A manifest written before the CRC existed loads as before.
TEST(Checkpoint, ManifestWithoutItsChecksumLoads) {
  const auto dir = fresh_dir("nocrc");
  TrainSpec spec = checkpoint_spec();
  run_local_ranks(
      2,
      [&](const ProcessGroupPtr& pg) {
        auto t = train(spec, pg, 2);
        auto want = full_state(t, pg);
        auto path = save_checkpoint(dir, 2, *t.model, t.opt.get(), pg);
        pg->barrier()->wait();
        if (pg->rank() == 0) edit_manifest(path, without_crc);
        pg->barrier()->wait();
        auto fresh = train(spec, pg, 0);
        EXPECT_EQ(load_checkpoint(path, *fresh.model, fresh.opt.get(), pg).step, 2);
        auto got = full_state(fresh, pg);
        if (pg->rank() == 0) expect_same(got, want, "loaded without the manifest's CRC");
      },
      test_options());
  remove_tree(dir);
}

TEST(CheckpointErrors, ShapeMismatch) {
  TrainSpec wider = checkpoint_spec();
  wider.model.dim = 64;
  expect_load_fails(
      "shape", [](const std::string&) {}, "tensor 'embed.weight' is Float [1001, 60]", wider);
}

TEST(CheckpointErrors, NameMismatch) {
  TrainSpec tied = checkpoint_spec();
  tied.model.outputs = 0;
  tied.model.tie_embeddings = true;
  // The tied model has no head.weight of its own (and a 1001-row head): the first difference
  // found is reported.
  expect_load_fails(
      "names", [](const std::string&) {}, "head.weight", tied);
}

}  // namespace
}  // namespace fsdp::testing
