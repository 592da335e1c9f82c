// LoRA's checks and PEFT's adapter directories (llama_lora.h, lora_options.h).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "fsdp/io/files.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/llama_lora.h"
#include "llama/lora_merge.h"
#include "llama/staged_directory.h"
#include "model_check.h"

namespace fsdp::models {

const std::vector<std::string>& lora_target_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool is_lora_parameter(const std::string& name) {
  return ends_with(name, ".lora_A.weight") || ends_with(name, ".lora_B.weight");
}

std::string lora_owner(const std::string& name) {
  if (!is_lora_parameter(name)) return "";
  return name.substr(0, name.size() - std::string(".lora_A.weight").size());
}

}  // namespace fsdp::models

namespace fsdp::models::llama {
namespace peft_files {

// PEFT's names: the model's under "base_model.model." (PeftModelForCausalLM > LoraModel > the
// transformers model), the adapter's name ("default") left out, as get_peft_model_state_dict
// saves them.
const std::string kPrefix = "base_model.model.";
const std::string kConfigFile = "adapter_config.json";
const std::string kWeightsFile = "adapter_model.safetensors";

// (in, out) of a target's weight in every decoder layer.
std::pair<int64_t, int64_t> target_dims(const Config& c, const std::string& target) {
  const int64_t d = c.hidden_size, i = c.intermediate_size;
  if (target == "q_proj") return {d, c.q_size()};
  if (target == "k_proj" || target == "v_proj") return {d, c.kv_size()};
  if (target == "o_proj") return {c.q_size(), d};
  if (target == "down_proj") return {i, d};
  return {d, i};  // gate_proj, up_proj
}

// What adapter_config.json says, in PEFT's keys.
nlohmann::json config_json(const LoraOptions& lora, const PeftSaveOptions& options) {
  nlohmann::json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] =
      options.base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(options.base_model);
  j["r"] = lora.rank;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = lora.targets;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["rank_pattern"] = nlohmann::json::object();
  j["alpha_pattern"] = nlohmann::json::object();
  j["revision"] = nullptr;
  return j;
}

// Problems when `lora` does not describe the model's adapters: their ranks, the Linears they
// adapt (every target adapted, none other), their scaling (alpha / rank).
std::vector<std::string> adapter_problems(const torch::nn::Module& model, const LoraOptions& lora) {
  const auto state = get_model_state_dict(model);
  std::vector<std::string> problems;
  std::set<std::string> owners;
  for (const auto& [name, s] : state) {
    if (!is_lora_parameter(name)) continue;
    owners.insert(lora_owner(name));
    const bool a = ends_with(name, ".lora_A.weight");
    const int64_t r = s.global_shape.at(a ? 0 : 1);
    if (r != lora.rank) {
      problems.push_back(fmt::format("'{}' has rank {}, not {}", name, r, lora.rank));
    }
    const auto dot = lora_owner(name).rfind('.');
    const std::string target = lora_owner(name).substr(dot + 1);
    if (std::find(lora.targets.begin(), lora.targets.end(), target) == lora.targets.end()) {
      problems.push_back(fmt::format("'{}' adapts {}, which the targets ({}) do not name", name,
                                     target, fmt::join(lora.targets, ", ")));
    }
  }
  if (owners.empty()) {
    problems.push_back("the model has no LoRA adapters");
    return problems;
  }
  for (const auto& t : lora.targets) {
    const bool adapted = std::any_of(owners.begin(), owners.end(),
                                     [&](const std::string& o) { return ends_with(o, "." + t); });
    if (!adapted) problems.push_back(fmt::format("no {} of the model has an adapter", t));
  }
  for (const auto& [owner, scaling] : detail::lora_scalings(model)) {
    if (lora.rank > 0 && std::abs(scaling - lora.scaling()) > 1e-12 * std::abs(scaling)) {
      problems.push_back(fmt::format("{}'s adapter scales by {:g}; alpha {:g} / rank {} is {:g}",
                                     owner, scaling, lora.alpha, lora.rank, lora.scaling()));
      break;
    }
  }
  return problems;
}

void require(bool ok, const std::string& path, const std::string& what) {
  if (!ok) throw CheckpointError(fmt::format("{}: {}", path, what));
}

}  // namespace peft_files

void validate_lora(const Config& config, const LoraOptions& lora, int tp_size) {
  if (!lora.enabled()) {
    FSDP_MODEL_CHECK(lora.rank == 0, "LoRA rank {} is negative (expected 0 for none, or above)",
                     lora.rank);
    return;
  }
  FSDP_MODEL_CHECK(tp_size == 1,
                   "LoRA adapters under tensor parallelism (degree {}) are not supported; use "
                   "FSDP alone (--tp 1)",
                   tp_size);
  FSDP_MODEL_CHECK(lora.alpha > 0, "LoRA alpha {} must be above 0", lora.alpha);
  FSDP_MODEL_CHECK(lora.dropout >= 0 && lora.dropout < 1, "LoRA dropout {} is not in [0, 1)",
                   lora.dropout);
  FSDP_MODEL_CHECK(!lora.targets.empty(), "LoRA has no targets (expected some of {})",
                   fmt::join(lora_target_names(), ", "));
  std::set<std::string> seen;
  for (const auto& t : lora.targets) {
    const auto& names = lora_target_names();
    FSDP_MODEL_CHECK(std::find(names.begin(), names.end(), t) != names.end(),
                     "LoRA target '{}' names no module of the Llama model (expected some of {})", t,
                     fmt::join(names, ", "));
    FSDP_MODEL_CHECK(seen.insert(t).second, "LoRA target '{}' is given twice", t);
    const auto [in, out] = peft_files::target_dims(config, t);
    FSDP_MODEL_CHECK(lora.rank <= std::min(in, out),
                     "LoRA rank {} is larger than {}'s weight allows ({} inputs, {} outputs: a "
                     "rank of at most {})",
                     lora.rank, t, in, out, std::min(in, out));
  }
}

int64_t lora_parameter_count(const Config& config, const LoraOptions& lora) {
  if (!lora.enabled()) return 0;
  int64_t per_layer = 0;
  for (const auto& t : lora.targets) {
    const auto [in, out] = peft_files::target_dims(config, t);
    per_layer += lora.rank * (in + out);
  }
  return per_layer * config.num_hidden_layers;
}

LoraOptions read_peft_adapter_config(const std::string& dir_in) {
  using peft_files::require;
  const std::string dir = io::without_trailing_slash(dir_in);
  const std::string path = dir + "/" + peft_files::kConfigFile;
  require(io::path_exists(path), dir,
          fmt::format("no {} (is it a PEFT adapter directory?)", peft_files::kConfigFile));
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{} is not valid JSON: {}", path, e.what()));
  }
  require(j.is_object(), path, "not a JSON object");
  auto value_or = [&](const char* key, const nlohmann::json& fallback) {
    return j.contains(key) && !j[key].is_null() ? j[key] : fallback;
  };
  const auto type = value_or("peft_type", "");
  require(type == "LORA", path, fmt::format("peft_type is {}, expected \"LORA\"", type.dump()));
  // What PEFT can put on a model that this library does not build: refused, not ignored.
  require(value_or("bias", "none") == "none", path, "bias other than \"none\" is not supported");
  for (const char* flag : {"fan_in_fan_out", "use_rslora", "use_dora"}) {
    require(value_or(flag, false) == false, path, fmt::format("{} is not supported", flag));
  }
  require(value_or("lora_bias", false) == false, path, "lora_bias is not supported");
  const auto init = value_or("init_lora_weights", true);
  // The initialisations that change the base weights (PiSSA, OLoRA, CorDA, LoftQ) make
  // adapters for a base model other than the directory's.
  require(init.is_boolean() || init == "gaussian", path,
          fmt::format("init_lora_weights {} changes the base model: not supported", init.dump()));
  for (const char* key :
       {"modules_to_save", "layers_to_transform", "layers_pattern", "exclude_modules",
        "target_parameters", "trainable_token_indices", "layer_replication"}) {
    const auto v = value_or(key, nullptr);
    require(v.is_null() || ((v.is_array() || v.is_object()) && v.empty()), path,
            fmt::format("{} ({}) is not supported", key, v.dump()));
  }
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    const auto v = value_or(key, nlohmann::json::object());
    require(v.is_object() && v.empty(), path, fmt::format("{} is not supported", key));
  }
  LoraOptions lora;
  try {
    lora.rank = j.at("r").get<int64_t>();
    lora.alpha = value_or("lora_alpha", 8).get<double>();
    lora.dropout = value_or("lora_dropout", 0.0).get<double>();
    const auto& targets = j.at("target_modules");
    require(targets.is_array(), path,
            fmt::format("target_modules {} is not a list of names (a regular expression is not "
                        "supported)",
                        targets.dump()));
    lora.targets = targets.get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("{}: {}", path, e.what()));
  }
  // PEFT keeps target_modules as a set: its order is not meaningful; ours follows the model.
  std::vector<std::string> ordered;
  for (const auto& name : lora_target_names()) {
    if (std::find(lora.targets.begin(), lora.targets.end(), name) != lora.targets.end()) {
      ordered.push_back(name);
    }
  }
  for (const auto& t : lora.targets) {
    require(std::find(ordered.begin(), ordered.end(), t) != ordered.end(), path,
            fmt::format("target_modules names '{}', which is not a Llama Linear ({})", t,
                        fmt::join(lora_target_names(), ", ")));
  }
  lora.targets = ordered;
  return lora;
}

void save_peft_adapter(const std::string& dir_in, const torch::nn::Module& model,
                       const LoraOptions& lora, const ProcessGroupPtr& world,
                       const PeftSaveOptions& options) {
  FSDP_MODEL_CHECK(world != nullptr, "save_peft_adapter: the process group is null");
  const std::string dir = io::without_trailing_slash(dir_in);
  const std::string what = fmt::format("save_peft_adapter {}", dir);
  const bool writer = world->rank() == 0;
  std::string tmp;
  agree_on<CheckpointError>(*world, what, [&] {
    if (dir.empty()) throw CheckpointError("the directory name is empty");
    detail::check_export_dtype(options.dtype);
    const auto problems = peft_files::adapter_problems(model, lora);
    if (!problems.empty()) throw CheckpointError(fmt::format("{}", fmt::join(problems, "; ")));
    if (writer) {
      detail::check_new_directory(dir);
      tmp = detail::make_staging_directory(dir);
    }
  });
  // The adapters are small (rank x dims per Linear): rank 0 keeps them all, then writes one file.
  NamedTensors adapters;
  FullStateDictOptions gather;
  gather.rank0_only = true;
  gather.cpu_offload = true;
  gather.dtype = options.dtype;
  gather.filter = is_lora_parameter;
  try {
    for_each_full_tensor(model, world, gather, [&](const std::string& name, const at::Tensor& t) {
      adapters.emplace_back(peft_files::kPrefix + name, t.contiguous());
    });
  } catch (...) {
    detail::discard_staged(tmp);  // a failed gather: nothing to agree on, nothing left behind
    throw;
  }
  agree_on<CheckpointError>(*world, what, [&] {
    if (!writer) return;
    detail::publish_staged(tmp, dir, [&] {
      write_safetensors(tmp + "/" + peft_files::kWeightsFile, adapters, {{"format", "pt"}});
      io::write_file(tmp + "/" + peft_files::kConfigFile,
                     peft_files::config_json(lora, options).dump(2) + "\n");
    });
  });
}

void load_peft_adapter(const std::string& dir_in, torch::nn::Module& model, const LoraOptions& lora,
                       const ProcessGroupPtr& world) {
  FSDP_MODEL_CHECK(world != nullptr, "load_peft_adapter: the process group is null");
  const std::string dir = io::without_trailing_slash(dir_in);
  const std::string what = fmt::format("load_peft_adapter {}", dir);
  ShardedLoadOptions options;
  options.keep = is_lora_parameter;
  SafetensorsLocations renamed;
  try {
    const LoraOptions found = read_peft_adapter_config(dir);
    const std::set<std::string> found_targets(found.targets.begin(), found.targets.end());
    const std::set<std::string> model_targets(lora.targets.begin(), lora.targets.end());
    if (found.rank != lora.rank || found.alpha != lora.alpha || found_targets != model_targets) {
      options.problems.push_back(fmt::format(
          "the adapters are rank {} alpha {:g} on {}; the model's are rank {} alpha {:g} on {}",
          found.rank, found.alpha, fmt::join(found.targets, ","), lora.rank, lora.alpha,
          fmt::join(lora.targets, ",")));
    }
    const std::string file = dir + "/" + peft_files::kWeightsFile;
    if (!io::path_exists(file)) {
      options.problems.push_back(fmt::format("{} holds no {}", dir, peft_files::kWeightsFile));
    } else {
      for (auto& [name, where] : locate_safetensors(file)) {
        // PEFT's names; a file of another adapter name ("base_model.model.x.lora_A.other.weight")
        // does not match the model's and is reported unexpected.
        const bool prefixed = name.rfind(peft_files::kPrefix, 0) == 0;
        const std::string model_name = prefixed ? name.substr(peft_files::kPrefix.size()) : name;
        if (!renamed.emplace(model_name, where).second) {
          options.problems.push_back(fmt::format("{} holds '{}' with and without the prefix {}",
                                                 file, model_name, peft_files::kPrefix));
        }
      }
    }
  } catch (const std::exception& e) {
    options.problems.push_back(e.what());
  }
  const auto problems = peft_files::adapter_problems(model, lora);
  options.problems.insert(options.problems.end(), problems.begin(), problems.end());
  load_safetensors_sharded(renamed, model, world, what, options);
}

}  // namespace fsdp::models::llama
