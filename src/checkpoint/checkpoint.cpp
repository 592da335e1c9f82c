// save_checkpoint, latest_checkpoint, load_checkpoint (fsdp/checkpoint/checkpoint.h). Every phase that can
// fail on one rank ends with agree_or_throw, so all ranks fail together and none waits forever
// in a collective the failed rank never reaches.
#include "fsdp/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/agreement.h"
#include "util/check.h"
#include "checkpoint/manifest.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/posix_files.h"
#include "checkpoint/rank_file.h"
#include "runtime/local_shards.h"

#ifndef FSDP_VERSION
#define FSDP_VERSION "unknown"
#endif

namespace fsdp {
namespace {

using detail::LocalShard;
using detail::Manifest;
using detail::StoredTensor;

constexpr const char* kStepPrefix = "step_";
constexpr const char* kTmpPrefix = ".tmp-";

std::string step_dir_name(int64_t step) { return fmt::format("{}{:010d}", kStepPrefix, step); }

// Test hook for crash safety: FSDP_TEST_KILL_IN_SAVE=<step> makes rank 0 kill itself with
// SIGKILL while saving that step, after every rank's data is on disk and before the manifest
// (the worst moment: everything written but not yet a checkpoint). ctest checkpoint_resume.
void kill_here_if_testing(int64_t step) {
  const char* at = std::getenv("FSDP_TEST_KILL_IN_SAVE");
  if (at && std::to_string(step) == at) ::raise(SIGKILL);
}

// The optimizer's parameters must be the model's (each by its identity).
void check_optimizer_params(const torch::optim::Optimizer* optimizer,
                            const std::vector<LocalShard>& shards) {
  if (!optimizer) return;
  std::unordered_set<const void*> model_params;
  for (const auto& s : shards) model_params.insert(s.tensor.unsafeGetTensorImpl());
  for (const auto& group : optimizer->param_groups()) {
    for (const auto& p : group.params()) {
      if (!model_params.count(p.unsafeGetTensorImpl())) {
        throw CheckpointError(
            "the optimizer holds a parameter that is not the model's (pass the optimizer built "
            "over this model's parameters: Unit::parameters())");
      }
    }
  }
}

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

void write_text_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  bool ok = fd >= 0 && ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  if (fd >= 0) ok = (::close(fd) == 0) && ok;
  if (!ok) throw CheckpointError(fmt::format("cannot write {}: {}", path, std::strerror(errno)));
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw CheckpointError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Complete checkpoints of `dir` (a step_ directory with its manifest), by step.
std::vector<std::pair<int64_t, std::string>> complete_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& name : detail::list_directory(dir)) {
    const std::string path = join(dir, name);
    if (name.rfind(kStepPrefix, 0) != 0 ||
        !detail::path_exists(join(path, detail::kManifestName))) {
      continue;
    }
    try {
      out.emplace_back(std::stoll(name.substr(std::strlen(kStepPrefix))), path);
    } catch (const std::exception&) {
      // not one of ours
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

// This rank's tensors, written to its file; returns the entries as a one-rank manifest.
Manifest write_rank_file(const std::string& tmp, int rank, const std::vector<LocalShard>& shards,
                         const torch::nn::Module& model, const torch::optim::Optimizer* optimizer,
                         const std::string& kind) {
  detail::RankFileWriter writer(tmp, fmt::format("rank_{:05d}.bin", rank));
  Manifest m;
  m.world_size = 1;
  auto add = [&](const std::string& name, const at::Tensor& rows, int64_t row_begin,
                 const std::vector<int64_t>& shape) {
    StoredTensor t{name, rows.scalar_type(), shape, {}};
    t.rows.push_back(writer.append(rows, row_begin, shape));
    t.rows.back().rank = rank;
    m.tensors.push_back(std::move(t));
  };
  for (const auto& s : shards) {
    if (s.replicated && rank != 0) continue;  // one copy is enough
    if (s.replica != 0) continue;             // hybrid sharding: replica 0's rows suffice
    add(s.name, s.tensor, s.row_begin, s.full_shape);
    if (!optimizer) continue;
    if (auto state = detail::param_state(*optimizer, kind, s.tensor)) {
      for (const auto& [suffix, t] : state->tensors) {
        auto shape = s.full_shape;
        add(s.name + "#" + suffix, t, s.row_begin, shape);
      }
      m.optimizer_steps[s.name] = state->step;
    }
  }
  if (rank == 0) {
    for (const auto& b : model.named_buffers(/*recurse=*/true)) {
      if (b.value().defined()) add(b.key(), b.value(), 0, b.value().sizes().vec());
    }
  }
  writer.finish();
  return m;
}

// Rank 0: one manifest from every rank's entries.
Manifest merge(const std::vector<std::string>& per_rank, int64_t step, const std::string& kind,
               const SaveOptions& options) {
  Manifest m;
  m.world_size = static_cast<int>(per_rank.size());
  m.step = step;
  m.library_version = FSDP_VERSION;
  m.metadata = options.metadata;
  m.optimizer = kind;
  std::unordered_map<std::string, size_t> index;
  for (size_t r = 0; r < per_rank.size(); ++r) {
    auto part = detail::manifest_from_json(per_rank[r], fmt::format("(rank {}'s entries)", r));
    for (auto& t : part.tensors) {
      auto it = index.find(t.name);
      if (it == index.end()) {
        index.emplace(t.name, m.tensors.size());
        m.tensors.push_back(std::move(t));
      } else {
        for (auto& rows : t.rows) m.tensors[it->second].rows.push_back(std::move(rows));
      }
    }
    for (const auto& [name, s] : part.optimizer_steps) m.optimizer_steps[name] = s;
  }
  return m;
}

}  // namespace

std::string save_checkpoint(const std::string& dir, int64_t step, const torch::nn::Module& model,
                            const torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg,
                            const SaveOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "save_checkpoint: the process group is null");
  FSDP_CHECK_ARG(step >= 0, "save_checkpoint: step must be >= 0, got {}", step);
  FSDP_CHECK_ARG(options.keep_last >= 0, "save_checkpoint: keep_last must be >= 0, got {}",
                 options.keep_last);
  auto& g = *pg;
  const int rank = g.rank();
  const std::string& root = dir;
  const std::string final_dir = join(root, step_dir_name(step));
  const std::string tmp = join(root, kTmpPrefix + step_dir_name(step));
  const std::string what = fmt::format("save_checkpoint {}", final_dir);

  std::vector<LocalShard> shards;
  std::string kind, error;
  try {
    shards = detail::local_shards(model);
    kind = detail::optimizer_kind(optimizer);
    check_optimizer_params(optimizer, shards);
    if (rank == 0) {
      if (detail::path_exists(final_dir)) {
        throw CheckpointError(fmt::format(
            "{} already exists; a checkpoint is never overwritten (remove it, or save another "
            "step)",
            final_dir));
      }
      detail::make_directories(root);
      // Left by a save that crashed: never renamed, so never a checkpoint.
      for (const auto& name : detail::list_directory(root)) {
        if (name.rfind(kTmpPrefix, 0) == 0) detail::remove_tree(join(root, name));
      }
      detail::make_directories(tmp);
    }
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(g, what, error);

  std::string entries;
  try {
    entries = detail::manifest_to_json(write_rank_file(tmp, rank, shards, model, optimizer, kind));
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(g, what, error);

  auto per_rank = detail::all_gather_strings(g, entries);
  if (rank == 0) {
    kill_here_if_testing(step);
    try {
      // The manifest last: a directory without it is not a checkpoint.
      write_text_file(join(tmp, detail::kManifestName),
                      detail::manifest_to_json(merge(per_rank, step, kind, options)));
      detail::sync_directory(tmp);
      detail::rename_path(tmp, final_dir);
      detail::sync_directory(root);
      if (options.keep_last > 0) {
        auto all = complete_checkpoints(root);
        for (size_t i = 0; i + options.keep_last < all.size(); ++i) {
          detail::remove_tree(all[i].second);
        }
      }
    } catch (...) {
      error = detail::current_exception_message();
    }
  }
  detail::agree_or_throw(g, what, error);
  return final_dir;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = complete_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back().second;
}

namespace {

// Everything a rank needs from the checkpoint, read and verified, not yet applied.
struct Staged {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, value read)
  std::vector<std::pair<at::Tensor, std::optional<detail::ParamState>>> states;
};

at::Tensor read_local(const std::string& dir, const StoredTensor& t, int64_t begin, int64_t end,
                      const at::Tensor& like) {
  auto staged = at::empty(like.sizes(), like.options().device(at::kCPU)).contiguous();
  detail::read_rows(dir, t, begin, end, staged);
  return staged;
}

std::string shape_str(const std::vector<int64_t>& s) {
  return fmt::format("[{}]", fmt::join(s, ", "));
}

Staged stage(const std::string& dir, const Manifest& m, const torch::nn::Module& model,
             const torch::optim::Optimizer* optimizer) {
  const std::string kind = detail::optimizer_kind(optimizer);
  auto shards = detail::local_shards(model);
  check_optimizer_params(optimizer, shards);
  std::unordered_map<std::string, const StoredTensor*> stored;
  for (const auto& t : m.tensors) stored[t.name] = &t;
  std::unordered_set<std::string> expected;
  Staged out;
  auto find = [&](const std::string& name, at::ScalarType dtype,
                  const std::vector<int64_t>& shape) -> const StoredTensor& {
    auto it = stored.find(name);
    if (it == stored.end()) {
      throw CheckpointError(fmt::format("{} has no tensor '{}' (the model's)", dir, name));
    }
    const StoredTensor& t = *it->second;
    if (t.dtype != dtype || t.shape != shape) {
      throw CheckpointError(fmt::format("tensor '{}' is {} {} in {}, the model's is {} {}", name,
                                        c10::toString(t.dtype), shape_str(t.shape), dir,
                                        c10::toString(dtype), shape_str(shape)));
    }
    expected.insert(name);
    return t;
  };
  if (optimizer && m.optimizer != kind) {
    throw CheckpointError(
        fmt::format("{} holds the state of optimizer '{}', not of '{}'", dir, m.optimizer, kind));
  }
  for (const auto& s : shards) {
    const auto& t = find(s.name, s.tensor.scalar_type(), s.full_shape);
    out.copies.emplace_back(s.tensor, read_local(dir, t, s.row_begin, s.row_end, s.tensor));
    if (!optimizer) continue;
    std::optional<detail::ParamState> state;
    auto step = m.optimizer_steps.find(s.name);
    if (step != m.optimizer_steps.end()) {
      state.emplace();
      state->step = step->second;
      for (const auto& suffix : detail::state_names(kind)) {
        const std::string name = s.name + "#" + suffix;
        auto it = stored.find(name);
        if (it == stored.end()) continue;
        const auto& st = find(name, it->second->dtype, s.full_shape);
        auto like = at::empty(s.tensor.sizes(), s.tensor.options().dtype(st.dtype));
        auto value = read_local(dir, st, s.row_begin, s.row_end, like);
        state->tensors[suffix] = value.to(s.tensor.device());
      }
    }
    out.states.emplace_back(s.tensor, std::move(state));
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    if (!b.value().defined()) continue;
    const auto& t = find(b.key(), b.value().scalar_type(), b.value().sizes().vec());
    out.copies.emplace_back(
        b.value(), read_local(dir, t, 0, b.value().dim() == 0 ? 1 : b.value().size(0), b.value()));
  }
  for (const auto& t : m.tensors) {
    const bool state = t.name.find('#') != std::string::npos;
    if (!expected.count(t.name) && !(state && !optimizer)) {
      throw CheckpointError(fmt::format(
          "{} holds '{}', which the model does not have (or the optimizer does not use)", dir,
          t.name));
    }
  }
  return out;
}

}  // namespace

CheckpointInfo load_checkpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg) {
  FSDP_CHECK_ARG(pg != nullptr, "load_checkpoint: the process group is null");
  const std::string& dir = path;
  Manifest m;
  Staged staged;
  std::string error;
  try {
    const auto manifest_path = join(dir, detail::kManifestName);
    m = detail::manifest_from_json(read_text_file(manifest_path), manifest_path);
    staged = stage(dir, m, model, optimizer);
  } catch (...) {
    error = detail::current_exception_message();
  }
  detail::agree_or_throw(*pg, fmt::format("load_checkpoint {}", path), error);
  // Every rank has everything: apply.
  {
    at::NoGradGuard no_grad;
    for (auto& [target, value] : staged.copies) target.copy_(value);
  }
  if (optimizer) {
    const std::string kind = detail::optimizer_kind(optimizer);
    for (const auto& [param, state] : staged.states) {
      detail::set_param_state(*optimizer, kind, param, state);
    }
  }
  return CheckpointInfo{path, m.step, m.world_size, m.metadata};
}

}  // namespace fsdp
