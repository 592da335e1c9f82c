// A (sharded) model out as a Hugging Face directory: save_hf_checkpoint.
//
// Phases, each ending in an agreement (fsdp/comm/agree.h) so that every rank throws the same
// error and none waits in a gather that another rank never reaches:
// (1) every rank checks the model against the config; rank 0 checks the destination and the
//     tokenizer files, plans the files from the global shapes and creates the temporary
//     directory;
// (2) every rank joins the gathers of for_each_full_tensor; rank 0 writes each tensor as it
//     arrives (a write error stops the writing, never the gathers);
// (3) rank 0 writes the index, config.json, generation_config.json, copies the tokenizer files,
//     and publishes the directory (io::publish: fsync, rename, fsync of the parent), or removes
//     it on any error.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "fsdp/io/files.h"
#include "fsdp/io/safetensors.h"
#include "fsdp/models/hf_checkpoint.h"
#include "llama/hf_files.h"
#include "llama/lora_merge.h"
#include "llama/staged_directory.h"
#include "model_check.h"

namespace fsdp::models::llama {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

struct PlannedFile {
  std::string name;
  std::vector<SafetensorsWriter::Spec> specs;
};

const char* dtype_config_name(torch::ScalarType t) {
  return t == torch::kBFloat16 ? "bfloat16" : t == torch::kHalf ? "float16" : "float32";
}

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

// The model's tensors must be the config's, so that config.json describes the files (under
// tensor parallelism: this rank's slices of them).
void check_model_matches(const ShardedStateDict& state, const Config& config,
                         const tp::Layout& tp) {
  std::map<std::string, std::vector<int64_t>> want;
  for (auto& [name, shape] : parameter_shapes(config)) {
    want[name] = shape;
    if (const tp::TpSlice* slice = tp.slice_of(name)) want[name][slice->dim] = slice->chunk.length;
  }
  std::vector<std::string> problems;
  std::set<std::string> seen;
  for (const auto& [name, s] : state) {
    seen.insert(name);
    auto it = want.find(name);
    if (it == want.end()) {
      problems.push_back(fmt::format("'{}' is not a tensor of this config", name));
    } else if (it->second != s.global_shape) {
      problems.push_back(fmt::format("'{}' is {}, the config's is {}", name,
                                     shape_str(s.global_shape), shape_str(it->second)));
    }
  }
  for (const auto& [name, shape] : want) {
    if (!seen.count(name)) problems.push_back(fmt::format("the model has no '{}'", name));
  }
  if (!problems.empty()) {
    throw CheckpointError(fmt::format("the model does not match the config ({}): {}",
                                      config.architecture(), fmt::join(problems, "; ")));
  }
}

// transformers' sharding (huggingface_hub's split_state_dict_into_shards): tensors in order,
// a new file when the next tensor would pass the limit; a tensor above the limit alone.
std::vector<PlannedFile> plan_files(const ShardedStateDict& state, torch::ScalarType dtype,
                                    int64_t max_bytes) {
  std::vector<std::vector<SafetensorsWriter::Spec>> groups;
  std::vector<SafetensorsWriter::Spec> current;
  int64_t current_bytes = 0;
  for (const auto& [name, s] : state) {
    const int64_t bytes = numel_of(s.global_shape) * static_cast<int64_t>(c10::elementSize(dtype));
    if (bytes > max_bytes || (current_bytes + bytes > max_bytes && !current.empty())) {
      if (!current.empty()) groups.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back({name, dtype, s.global_shape});
    current_bytes += bytes;
  }
  if (!current.empty()) groups.push_back(std::move(current));
  std::vector<PlannedFile> files;
  for (size_t i = 0; i < groups.size(); ++i) {
    std::string name = groups.size() == 1 ? std::string(detail::kSingleFile)
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1,
                                                        groups.size());
    files.push_back({std::move(name), std::move(groups[i])});
  }
  return files;
}

// (source path, name in the directory) of each tokenizer file to copy.
std::vector<std::pair<std::string, std::string>> tokenizer_copies(
    const std::vector<std::string>& given) {
  std::vector<std::pair<std::string, std::string>> out;
  std::set<std::string> names;
  auto add = [&](const std::string& from, const std::string& name) {
    if (!names.insert(name).second) {
      throw CheckpointError(fmt::format("tokenizer file {} is given twice", name));
    }
    out.emplace_back(from, name);
  };
  for (const auto& path : given) {
    if (io::is_directory(path)) {
      size_t before = out.size();
      for (const auto& name : tokenizer_file_names()) {
        if (io::path_exists(path + "/" + name)) add(path + "/" + name, name);
      }
      if (out.size() == before) {
        throw CheckpointError(fmt::format("tokenizer directory {} holds none of {}", path,
                                          fmt::join(tokenizer_file_names(), ", ")));
      }
    } else if (io::path_exists(path)) {
      const auto slash = path.find_last_of('/');
      add(path, slash == std::string::npos ? path : path.substr(slash + 1));
    } else {
      throw CheckpointError(fmt::format("tokenizer file {} does not exist", path));
    }
  }
  return out;
}

std::string index_json(const std::vector<PlannedFile>& files, torch::ScalarType dtype) {
  nlohmann::json map = nlohmann::json::object();
  int64_t parameters = 0;
  for (const auto& f : files) {
    for (const auto& s : f.specs) {
      map[s.name] = f.name;
      parameters += numel_of(s.shape);
    }
  }
  nlohmann::json j;
  j["metadata"] = {{"total_parameters", parameters},
                   {"total_size", parameters * static_cast<int64_t>(c10::elementSize(dtype))}};
  j["weight_map"] = map;
  return j.dump(2) + "\n";
}

}  // namespace

const std::vector<std::string>& tokenizer_file_names() {
  // chat_template.jinja: where transformers 4.43+ saves a chat template (tokenize_chat.py and
  // generation read it); vocab.json and merges.txt: GPT-2-style BPE tokenizers without a
  // tokenizer.json.
  static const std::vector<std::string> names = {"tokenizer.model",
                                                 "tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "added_tokens.json",
                                                 "chat_template.jinja",
                                                 "vocab.json",
                                                 "merges.txt"};
  return names;
}

void save_hf_checkpoint(const std::string& dir_in, const torch::nn::Module& model,
                        const Config& config, const ProcessGroupPtr& world,
                        const HfSaveOptions& options) {
  FSDP_MODEL_CHECK(world != nullptr, "save_hf_checkpoint: the process group is null");
  const std::string dir = io::without_trailing_slash(dir_in);
  const std::string what = fmt::format("save_hf_checkpoint {}", dir);
  const bool writer = world->rank() == 0;
  std::vector<PlannedFile> files;
  std::vector<std::pair<std::string, std::string>> copies;
  std::string tmp, error;  // error: rank 0's first write error in phase (2)

  const tp::Layout layout = tp_layout(config, options.tp);
  // (1) Checks and the plan.
  agree_on<CheckpointError>(*world, what, [&] {
    if (dir.empty()) throw CheckpointError("the directory name is empty");
    detail::check_export_dtype(options.dtype);
    if (options.max_shard_bytes <= 0) {
      throw CheckpointError(
          fmt::format("max_shard_bytes is {}, expected > 0", options.max_shard_bytes));
    }
    validate(config);
    // Names and global shapes, no communication; LoRA adapters are merged, not written.
    auto state = detail::without_lora(get_model_state_dict(model));
    check_model_matches(state, config, layout);
    // The files hold the full tensors.
    for (auto& [name, s] : state) {
      if (const tp::TpSlice* slice = layout.slice_of(name)) s.global_shape = slice->full;
    }
    if (writer) {
      detail::check_new_directory(dir);
      copies = tokenizer_copies(options.tokenizer_files);
      files = plan_files(state, options.dtype, options.max_shard_bytes);
      tmp = detail::make_staging_directory(dir);
    }
  });

  // (2) One full tensor at a time, written by rank 0 as it arrives.
  size_t file = 0, next = 0;
  std::unique_ptr<SafetensorsWriter> out;
  FullStateDictOptions gather;
  gather.rank0_only = true;
  gather.cpu_offload = true;
  gather.dtype = options.dtype;
  gather.tp = layout;
  // A model with LoRA adapters is written merged; the merge reads the weights in their own
  // dtype (converted as they are written).
  const auto scalings = detail::lora_scalings(model);
  if (!scalings.empty()) gather.dtype.reset();
  auto write = [&](const std::string& name, const at::Tensor& t) {
    if (!error.empty()) return;  // keep joining the gathers; write nothing more
    try {
      const auto& planned = files.at(file);
      if (planned.specs.at(next).name != name) {
        throw CheckpointError(fmt::format("tensor '{}' arrived where '{}' was planned", name,
                                          planned.specs[next].name));
      }
      if (!out) {
        out = std::make_unique<SafetensorsWriter>(
            tmp + "/" + planned.name, planned.specs,
            std::map<std::string, std::string>{{"format", "pt"}});
      }
      out->write_next(t.scalar_type() == options.dtype ? t : t.to(options.dtype));
      if (++next == planned.specs.size()) {
        out->finish();  // flushed to the disk
        out.reset();
        ++file;
        next = 0;
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  };
  detail::LoraMerger merger(scalings, write);
  try {
    for_each_full_tensor(model, world, gather, [&](const std::string& name, const at::Tensor& t) {
      if (scalings.empty()) return write(name, t);
      if (!error.empty()) return;
      try {
        merger.add(name, t);
      } catch (const std::exception& e) {
        error = e.what();
      }
    });
    if (writer && error.empty() && !scalings.empty()) {
      try {
        merger.finish();
      } catch (const std::exception& e) {
        error = e.what();  // reported in (3), agreed
      }
    }
  } catch (...) {
    // A failed gather (a communication error): nothing to agree on; leave nothing behind.
    out.reset();
    detail::discard_staged(tmp);
    throw;
  }

  // (3) The small files, then the directory into place.
  agree_on<CheckpointError>(*world, what, [&] {
    if (!writer) return;
    out.reset();  // an unfinished file of a failed write, closed before its directory goes
    detail::publish_staged(tmp, dir, [&] {
      if (!error.empty()) throw CheckpointError(error);
      if (file != files.size()) {
        throw CheckpointError(fmt::format("{} of {} files written", file, files.size()));
      }
      if (files.size() > 1) {
        io::write_file(tmp + "/" + detail::kIndexFile, index_json(files, options.dtype));
      }
      Config written = config;
      written.dtype = dtype_config_name(options.dtype);
      io::write_file(tmp + "/config.json", to_hf_json(written));
      io::write_file(tmp + "/generation_config.json", to_generation_json(config));
      for (const auto& [from, name] : copies) io::copy_file(from, tmp + "/" + name);
    });
  });
}

}  // namespace fsdp::models::llama
