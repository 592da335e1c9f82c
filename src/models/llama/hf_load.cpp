// Hugging Face directories into a (sharded) model: load_hf_weights, load_hf_model.
//
// The directory's files are located from their headers (a few KB each; the index checked
// against them), then the checkpoint layer's sharded safetensors loader checks every tensor
// against the model, reads this rank's rows and agrees before any parameter changes
// (fsdp/checkpoint/export.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "fsdp/checkpoint/export.h"
#include "fsdp/comm/agree.h"
#include "fsdp/io/files.h"
#include "fsdp/models/hf_checkpoint.h"
#include "llama/hf_files.h"
#include "model_check.h"

namespace fsdp::models::llama {
namespace {

// The weight_map of an index: tensor name -> file name (a plain name in the directory).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(index_path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{} is not valid JSON: {}", index_path, e.what()));
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
    throw CheckpointError(fmt::format("{} has no \"weight_map\" object", index_path));
  }
  std::map<std::string, std::string> map;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) {
      throw CheckpointError(
          fmt::format("{}: the weight_map entry of '{}' is not a file name", index_path, name));
    }
    const auto f = file.get<std::string>();
    // Files of the directory only: no paths that lead elsewhere.
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
      throw CheckpointError(
          fmt::format("{}: the weight_map puts '{}' in \"{}\", not a file name of the directory",
                      index_path, name, f));
    }
    map[name] = f;
  }
  return map;
}

// The files to read and, when sharded, the index's weight_map (empty for one file). As
// transformers' from_pretrained: model.safetensors when present, else the index.
std::pair<std::map<std::string, std::string>, std::vector<std::string>> weight_layout(
    const std::string& dir) {
  if (io::path_exists(dir + "/" + detail::kSingleFile)) {
    return {{}, {detail::kSingleFile}};
  }
  const std::string index_path = dir + "/" + detail::kIndexFile;
  if (!io::path_exists(index_path)) {
    throw CheckpointError(
        fmt::format("{} holds neither {} nor {} (is it a Hugging Face model "
                    "directory?)",
                    dir, detail::kSingleFile, detail::kIndexFile));
  }
  auto weight_map = read_weight_map(index_path);
  std::vector<std::string> files;
  for (const auto& [name, file] : weight_map) {
    if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
  }
  return {std::move(weight_map), std::move(files)};
}

// Old conversions stored the rotary frequencies; transformers ignores them when loading.
bool ignored_entry(const std::string& name) {
  const std::string suffix = "rotary_emb.inv_freq";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor of the directory by name, reading the headers only. Problems go to `problems`;
// names the index puts in a file that could not be read go to `unreadable`.
SafetensorsLocations locate_tensors(const std::string& dir, std::vector<std::string>& problems,
                                    std::set<std::string>& unreadable) {
  SafetensorsLocations found;
  const auto layout = weight_layout(dir);
  const auto& weight_map = layout.first;  // empty for one file
  const auto& files = layout.second;
  for (const auto& file : files) {
    const std::string path = dir + "/" + file;
    auto mark_unreadable = [&] {
      for (const auto& [name, f] : weight_map) {
        if (f == file) unreadable.insert(name);
      }
    };
    if (!io::path_exists(path)) {
      problems.push_back(
          fmt::format("missing file {} (the index puts {} tensors in it)", path,
                      std::count_if(weight_map.begin(), weight_map.end(),
                                    [&](const auto& kv) { return kv.second == file; })));
      mark_unreadable();
      continue;
    }
    SafetensorsIndex index;
    try {
      index = read_safetensors_index(path);
    } catch (const std::exception& e) {
      problems.push_back(e.what());  // names the file (and says "truncated file?" when it is)
      mark_unreadable();
      continue;
    }
    for (auto& e : index.entries) {
      if (!weight_map.empty()) {
        auto it = weight_map.find(e.name);
        if (it == weight_map.end() || it->second != file) {
          problems.push_back(
              fmt::format("{} holds '{}', which the index {}", path, e.name,
                          it == weight_map.end() ? "does not list" : "puts in " + it->second));
          continue;
        }
      }
      if (found.count(e.name)) {
        problems.push_back(
            fmt::format("'{}' is in both {} and {}", e.name, found[e.name].file, path));
        continue;
      }
      found[e.name] = SafetensorsLocation{path, e};
    }
  }
  for (const auto& [name, file] : weight_map) {
    if (!found.count(name) && !unreadable.count(name)) {
      problems.push_back(
          fmt::format("the index puts '{}' in {}, which does not hold it", name, file));
      unreadable.insert(name);  // reported here, not again as missing
    }
  }
  return found;
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& dir) {
  return weight_layout(io::without_trailing_slash(dir)).second;
}

void load_hf_weights(const std::string& dir_in, torch::nn::Module& model,
                     const ProcessGroupPtr& world, std::map<std::string, tp::TpSlice> slices) {
  FSDP_MODEL_CHECK(world != nullptr, "load_hf_weights: the process group is null");
  const std::string dir = io::without_trailing_slash(dir_in);
  const std::string what = fmt::format("load_hf_weights {}", dir);
  ShardedLoadOptions options;
  options.ignore = ignored_entry;
  options.slices = std::move(slices);
  // LoRA adapters are not the base model's: never in a Hugging Face directory.
  options.keep = [](const std::string& name) { return !is_lora_parameter(name); };
  SafetensorsLocations found;
  try {
    found = locate_tensors(dir, options.problems, options.unreadable);
  } catch (const std::exception& e) {
    // Not a model directory, or an index that is not one: the load reports it with the rest.
    options.problems.push_back(e.what());
  }
  load_safetensors_sharded(found, model, world, what, options);
}

HfModel load_hf_model(const std::string& dir, const ProcessGroupPtr& world,
                      const HfLoadOptions& options) {
  FSDP_MODEL_CHECK(world != nullptr, "load_hf_model: the process group is null");
  HfModel out;
  // Agreed, so that a rank that cannot read the config does not leave the others waiting in the
  // load's collectives.
  agree_on<CheckpointError>(*world, fmt::format("load_hf_model {}", dir),
                            [&] { out.config = read_hf_config(dir); });
  BuildOptions build;
  build.dtype = options.dtype;
  build.random_init = false;
  build.on_layer_built = options.on_layer_built;
  build.tp = options.tp;
  build.sequence_parallel = options.sequence_parallel;
  build.lora = options.lora;
  build.float8 = options.float8;
  out.model = build_llama(out.config, build);
  if (options.on_model_built) options.on_model_built(out.model);
  const int tp_size = options.tp ? options.tp->size() : 1;
  load_hf_weights(dir, *out.model, world,
                  tp_slices(out.config, tp_size, options.tp ? options.tp->rank() : 0));
  return out;
}

}  // namespace fsdp::models::llama
