// Hugging Face directories into a (sharded) model: load_hf_weights, load_hf_model.
//
// Three phases on every rank: (1) read every file's header (a few KB each) and check names,
// shapes and dtypes against the model's state dict, collecting every problem; (2) read this
// rank's rows of each tensor into staging tensors (only when (1) found nothing); (3) agree
// (checkpoint/agreement.h), then copy the staged rows into the parameters. A failure on any
// rank therefore fails every rank before any parameter changes.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "checkpoint/agreement.h"
#include "checkpoint/posix_files.h"
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf_checkpoint.h"
#include "models/llama/hf_files.h"
#include "util/check.h"
#include "util/format.h"

namespace fsdp::models::llama {
namespace {

using fsdp::detail::shape_str;

// Where each tensor of the directory is.
struct Located {
  std::string file;  // full path
  SafetensorsEntry entry;
};

// The weight_map of an index: tensor name -> file name (a plain name in the directory).
std::map<std::string, std::string> read_weight_map(const std::string& index_path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(detail::read_text_file(index_path));
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
  if (fsdp::detail::path_exists(dir + "/" + detail::kSingleFile)) {
    return {{}, {detail::kSingleFile}};
  }
  const std::string index_path = dir + "/" + detail::kIndexFile;
  if (!fsdp::detail::path_exists(index_path)) {
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
std::map<std::string, Located> locate_tensors(const std::string& dir,
                                              std::vector<std::string>& problems,
                                              std::set<std::string>& unreadable) {
  std::map<std::string, Located> found;
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
    if (!fsdp::detail::path_exists(path)) {
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
      found[e.name] = Located{path, e};
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
  return weight_layout(detail::without_trailing_slash(dir)).second;
}

void load_hf_weights(const std::string& dir_in, torch::nn::Module& model,
                     const ProcessGroupPtr& world) {
  FSDP_CHECK_ARG(world != nullptr, "load_hf_weights: the process group is null");
  const std::string dir = detail::without_trailing_slash(dir_in);
  std::vector<std::pair<at::Tensor, at::Tensor>> staged;  // (this rank's rows, values read)
  std::vector<std::string> problems;
  std::string error;
  try {
    std::set<std::string> unreadable;
    auto found = locate_tensors(dir, problems, unreadable);
    auto state = get_model_state_dict(model);
    // A tensor registered under several names (the tied head) is in the state dict once, under
    // its first name; its other names may be in the files too (and are ignored).
    std::unordered_map<const void*, std::string> first_name;
    std::map<std::string, std::vector<int64_t>> shape_of;
    for (const auto& [name, s] : state) shape_of[name] = s.global_shape;
    std::map<std::string, std::string> alias_of;  // other name -> first name
    for (const auto& p : model.named_parameters(/*recurse=*/true)) {
      auto [it, fresh] = first_name.emplace(p.value().unsafeGetTensorImpl(), p.key());
      if (!fresh) alias_of[p.key()] = it->second;
    }
    std::vector<std::string> missing;
    std::vector<std::pair<const ShardedTensor*, const Located*>> to_read;
    for (const auto& [name, s] : state) {
      auto it = found.find(name);
      if (it == found.end()) {
        if (!unreadable.count(name))
          missing.push_back(fmt::format("'{}' {}", name, shape_str(s.global_shape)));
        continue;
      }
      const auto& e = it->second.entry;
      if (e.shape != s.global_shape) {
        problems.push_back(fmt::format("'{}' has shape {} in {}; the model's is {}", name,
                                       shape_str(e.shape), it->second.file,
                                       shape_str(s.global_shape)));
      } else if (e.dtype != at::kFloat && e.dtype != at::kBFloat16 && e.dtype != at::kHalf) {
        problems.push_back(fmt::format("'{}' is {} in {}; expected F32, BF16 or F16", name,
                                       c10::toString(e.dtype), it->second.file));
      } else {
        to_read.emplace_back(&s, &it->second);
      }
    }
    if (!missing.empty()) {
      problems.push_back(fmt::format("missing tensors: {}", fmt::join(missing, ", ")));
    }
    std::vector<std::string> unexpected;
    for (const auto& [name, where] : found) {
      if (shape_of.count(name) || ignored_entry(name)) continue;
      auto alias = alias_of.find(name);
      if (alias == alias_of.end()) {
        unexpected.push_back(fmt::format("'{}' (in {})", name, where.file));
      } else if (where.entry.shape != shape_of[alias->second]) {
        problems.push_back(fmt::format("'{}' has shape {} in {}; it is the model's '{}' of {}",
                                       name, shape_str(where.entry.shape), where.file,
                                       alias->second, shape_str(shape_of[alias->second])));
      }
    }
    if (!unexpected.empty()) {
      problems.push_back(
          fmt::format("tensors the model does not have: {}", fmt::join(unexpected, ", ")));
    }
    if (problems.empty()) {
      // s->local is the live parameter (this rank's rows): staged, copied after agreement.
      for (const auto& [s, where] : to_read) {
        auto rows = read_safetensors_rows(where->file, where->entry, s->row_offset,
                                          s->row_offset + s->rows());
        staged.emplace_back(s->local, rows.view(s->local.sizes()));
      }
    }
  } catch (const std::exception& e) {
    problems.push_back(e.what());
  }
  if (!problems.empty()) {
    error = problems.size() == 1
                ? problems[0]
                : fmt::format("{} problems: {}", problems.size(), fmt::join(problems, "; "));
  }
  fsdp::detail::agree_or_throw(*world, fmt::format("load_hf_weights {}", dir), error);
  at::NoGradGuard no_grad;
  for (auto& [target, value] : staged) target.copy_(value);
}

HfModel load_hf_model(const std::string& dir, const ProcessGroupPtr& world,
                      const HfLoadOptions& options) {
  FSDP_CHECK_ARG(world != nullptr, "load_hf_model: the process group is null");
  HfModel out;
  // Agreed, so that a rank that cannot read the config does not leave the others waiting in the
  // load's collectives.
  std::string error;
  try {
    out.config = read_hf_config(dir);
  } catch (const std::exception& e) {
    error = e.what();
  }
  fsdp::detail::agree_or_throw(*world, fmt::format("load_hf_model {}", dir), error);
  BuildOptions build;
  build.dtype = options.dtype;
  build.random_init = false;
  build.on_layer_built = options.on_layer_built;
  out.model = build_llama(out.config, build);
  if (options.on_model_built) options.on_model_built(out.model);
  load_hf_weights(dir, *out.model, world);
  return out;
}

}  // namespace fsdp::models::llama
