// save_checkpoint, latest_checkpoint, load_checkpoint (fsdp/checkpoint/checkpoint.h). Every phase
// that can fail on one rank runs through agree_on (fsdp/comm/agree.h), so all ranks fail together
// and none waits forever in a collective the failed rank never reaches.
#include "fsdp/checkpoint/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/dim_shards.h"
#include "checkpoint/manifest.h"
#include "checkpoint/rank_file.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "fsdp/io/files.h"
#include "util/check.h"
#include "util/format.h"

#ifndef FSDP_VERSION
#define FSDP_VERSION "unknown"
#endif

namespace fsdp {
namespace {

using detail::Manifest;
using detail::shape_str;
using detail::StoredTensor;

constexpr const char* kStepPrefix = "step_";
constexpr const char* kTmpPrefix = ".tmp-";
// A checkpoint that retention removes is first renamed to this prefix + its name: a removal cut
// short leaves no step_ directory with part of its files.
constexpr const char* kRemovingPrefix = ".tmp-removing-";

std::string step_dir_name(int64_t step) { return fmt::format("{}{:010d}", kStepPrefix, step); }

// The step of a name "step_" and 10 to 19 digits (what step_dir_name writes: at least ten,
// and an int64 has at most 19), else nullopt: a user's "step_2_best" or "step_5" beside the
// checkpoints is neither loaded nor removed.
std::optional<int64_t> step_of(const std::string& name) {
  const size_t n = std::strlen(kStepPrefix);
  if (name.size() < n + 10 || name.size() > n + 19 || name.compare(0, n, kStepPrefix) != 0) {
    return std::nullopt;
  }
  for (size_t i = n; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  }
  try {
    return std::stoll(name.substr(n));
  } catch (const std::out_of_range&) {
    return std::nullopt;  // 19 digits above int64's largest
  }
}

// Test hook for crash safety: FSDP_TEST_KILL_IN_SAVE=<step> makes rank 0 kill itself with
// SIGKILL while saving that step, after every rank's data is on disk and before the manifest
// (the worst moment: everything written but not yet a checkpoint). ctest checkpoint_resume.
void kill_here_if_testing(int64_t step) {
  const char* at = std::getenv("FSDP_TEST_KILL_IN_SAVE");
  if (at && std::to_string(step) == at) ::raise(SIGKILL);
}

std::string join(const std::string& dir, const std::string& name) { return dir + "/" + name; }

struct StepDirs {
  std::vector<std::pair<int64_t, std::string>> complete;  // with their manifest, by step
  std::vector<std::pair<int64_t, std::string>> damaged;   // without it, by step
};

// The step_<digits> directories of `dir`.
StepDirs step_directories(const std::string& dir) {
  StepDirs out;
  for (const auto& name : io::list_directory(dir)) {
    const auto step = step_of(name);
    const std::string path = join(dir, name);
    if (!step || !io::is_directory(path)) continue;
    const bool complete = io::path_exists(join(path, detail::kManifestName));
    (complete ? out.complete : out.damaged).emplace_back(*step, path);
  }
  std::sort(out.complete.begin(), out.complete.end());
  std::sort(out.damaged.begin(), out.damaged.end());
  return out;
}

// What a save or a removal of this library left when it was cut short: ".tmp-step_<digits>"
// (never renamed, so never a checkpoint) and ".tmp-removing-step_<digits>". Nothing else: a
// user's ".tmp-notes" stays.
bool left_by_a_crash(const std::string& name) {
  for (const std::string_view prefix : {kRemovingPrefix, kTmpPrefix}) {
    if (name.rfind(prefix, 0) == 0 && step_of(name.substr(prefix.size()))) return true;
  }
  return false;
}

// Retention's removal: renamed aside first (atomic), so that a crash in the middle of the
// removal leaves either the whole checkpoint or none of it under its name.
void remove_checkpoint(const std::string& root, const std::string& path) {
  const std::string aside = join(root, kRemovingPrefix + path.substr(root.size() + 1));
  io::remove_tree(aside);
  io::rename_path(path, aside);
  io::sync_path(root);
  io::remove_tree(aside);
}

// Tensor parallelism: each entry of this rank's state (in the frame of its TP slice) as rows of
// the full tensor. Rows of a row slice are rows of the full tensor at the slice's offset; a
// column slice's rows are gathered whole over the TP group (every TP rank of one data-parallel
// rank holds the same shard rows), written by TP rank 0; entries whole on every TP rank too.
ShardedStateDict full_frame(ShardedStateDict state, const tp::Layout& tp) {
  const int tp_rank = tp.group->rank();
  for (auto& [name, s] : state) {
    const tp::TpSlice* slice = s.local.defined() ? tp.slice_of(name) : nullptr;
    if (slice && s.global_shape.size() == slice->full.size() && !s.replicated) {
      if (slice->dim == 0) {
        s.row_offset += slice->chunk.offset;
      } else {
        s.local = tp::gather_dim(s.local, slice->dim, slice->full[slice->dim], tp.group);
        s.replica = s.replica * tp.group->size() + tp_rank;
      }
      s.global_shape = slice->full;
    } else if (slice && s.replicated && s.global_shape.size() == slice->full.size()) {
      // A slice outside every unit (whole on its rank): the full tensor gathered, TP rank 0's.
      s.local = tp::gather_dim(s.local, slice->dim, slice->full[slice->dim], tp.group);
      s.global_shape = slice->full;
      if (tp_rank != 0) s.local = at::Tensor();
    } else if (tp_rank != 0) {
      // Equal on every TP rank (norms, biases after a sum, scalars): TP rank 0's copy.
      if (s.replicated) {
        s.local = at::Tensor();
      } else {
        s.replica = s.replica * tp.group->size() + tp_rank;
      }
    }
  }
  return state;
}

// This rank's tensors, written to its file; returns the entries as a one-rank manifest. Each
// row is written once: replicated tensors by rank 0, hybrid sharding's rows by replica 0.
Manifest write_rank_file(const std::string& tmp, int rank, const ShardedStateDict& state) {
  detail::RankFileWriter writer(tmp, fmt::format("rank_{:05d}.bin", rank));
  Manifest m;
  m.world_size = 1;
  for (const auto& [name, t] : state) {
    if ((t.replicated && rank != 0) || t.replica != 0 || !t.local.defined()) continue;
    StoredTensor st{name, t.local.scalar_type(), t.global_shape, {}};
    st.rows.push_back(writer.append(t.local, t.row_offset, t.global_shape));
    st.rows.back().rank = rank;
    m.tensors.push_back(std::move(st));
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
  m.partial = static_cast<bool>(options.filter);
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

// The parameter a state entry belongs to: "<name>#<state>" is <name>'s optimizer state; an
// entry of the optimizer as a whole ("#optimizer", "#param_groups.0") belongs to none ("").
std::string owner_of(const std::string& entry) {
  const auto hash = entry.find('#');
  return hash == std::string::npos ? entry : entry.substr(0, hash);
}

// SaveOptions/LoadOptions::filter applied to an entry: the optimizer's own entries always pass.
bool passes(const std::function<bool(const std::string&)>& filter, const std::string& entry) {
  if (!filter) return true;
  const auto owner = owner_of(entry);
  return owner.empty() || filter(owner);
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
  if (options.filter && optimizer) {
    std::unordered_set<const void*> updated;
    for (const auto& group : optimizer->param_groups()) {
      for (const auto& p : group.params()) updated.insert(p.unsafeGetTensorImpl());
    }
    for (const auto& item : model.named_parameters()) {
      const auto& p = item.value();
      FSDP_CHECK_ARG(!p.requires_grad() || !updated.count(p.unsafeGetTensorImpl()) ||
                         options.filter(item.key()),
                     "save_checkpoint: SaveOptions::filter leaves out '{}', which the optimizer "
                     "updates: its value and state would be lost (a filter must keep every "
                     "trainable parameter)",
                     item.key());
    }
  }

  ShardedStateDict state;
  std::string kind = "none";
  agree_on<CheckpointError>(g, what, [&] {
    state = get_model_state_dict(model);
    if (optimizer) {
      kind = optimizer_kind(*optimizer);
      for (auto& e : get_optimizer_state_dict(model, *optimizer)) state.push_back(std::move(e));
    }
    if (options.filter) {
      ShardedStateDict kept;
      for (auto& e : state) {
        if (passes(options.filter, e.first)) kept.push_back(std::move(e));
      }
      state = std::move(kept);
    }
    if (rank == 0) {
      if (io::path_exists(final_dir)) {
        throw CheckpointError(fmt::format(
            "{} already exists; a checkpoint is never overwritten (remove it, or save another "
            "step)",
            final_dir));
      }
      io::make_directories(root);  // durably: each directory it makes is flushed
      for (const auto& name : io::list_directory(root)) {
        if (left_by_a_crash(name)) io::remove_tree(join(root, name));
      }
      io::make_directories(tmp);
    }
  });

  // Shards of a dim other than 0 as rows (collective over their shard groups, in state order),
  // then under tensor parallelism every tensor as rows of the full one (collective over the TP
  // group for slices of columns, in the same order).
  for (auto& entry : state) entry.second = detail::as_rows(entry.second);
  if (options.tp.active()) state = full_frame(std::move(state), options.tp);

  // A save that fails after the staging directory exists removes it (rank 0, once every rank
  // has stopped writing: agree_on returns or throws on every rank together), so that a full
  // disk does not stay full until the next save.
  try {
    std::string entries;
    agree_on<CheckpointError>(
        g, what, [&] { entries = detail::manifest_to_json(write_rank_file(tmp, rank, state)); });

    auto per_rank = all_gather_strings(g, entries);
    agree_on<CheckpointError>(g, what, [&] {
      if (rank != 0) return;
      kill_here_if_testing(step);
      // The manifest last: a directory without it is not a checkpoint.
      io::write_file(join(tmp, detail::kManifestName),
                     detail::manifest_to_json(merge(per_rank, step, kind, options)));
      io::publish(tmp, final_dir);
      if (options.keep_last > 0) {
        // Checkpoints of earlier steps only: never the one just saved, and never a later
        // step's (another run's, or the future of a run resumed from an earlier step: not this
        // save's to judge).
        std::vector<std::pair<int64_t, std::string>> older;
        for (const auto& c : step_directories(root).complete) {
          if (c.first < step) older.push_back(c);
        }
        const size_t keep_older = static_cast<size_t>(options.keep_last - 1);
        for (size_t i = 0; i + keep_older < older.size(); ++i) {
          remove_checkpoint(root, older[i].second);
        }
      }
    });
  } catch (...) {
    if (rank == 0 && io::path_exists(tmp)) {
      try {
        io::remove_tree(tmp);
      } catch (const std::exception&) {
        // the save's own error is the one to report
      }
    }
    throw;
  }
  return final_dir;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  if (!io::path_exists(dir)) return std::nullopt;
  const auto dirs = step_directories(dir);
  const int64_t latest = dirs.complete.empty() ? -1 : dirs.complete.back().first;
  if (!dirs.damaged.empty() && dirs.damaged.back().first > latest) {
    // A save publishes its directory with the manifest inside and retention renames a
    // checkpoint away before removing it, so a step directory without its manifest was
    // damaged from outside. Resuming from an older one instead would silently train those
    // steps again (and then fail to save over the damaged one).
    throw CheckpointError(fmt::format(
        "{} has no {}: the newest checkpoint of {} is damaged{}; move it away (or restore its "
        "manifest) to go on",
        dirs.damaged.back().second, detail::kManifestName, dir,
        latest >= 0 ? fmt::format(" (the newest complete one is {})", dirs.complete.back().second)
                    : std::string()));
  }
  if (dirs.complete.empty()) return std::nullopt;
  return dirs.complete.back().second;
}

namespace {

// Everything a rank needs from the checkpoint, read and verified, not yet applied.
struct Staged {
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, value read)
  ShardedStateDict optimizer;                             // this rank's rows of its state
};

at::Tensor read_rows_like(const std::string& dir, const StoredTensor& t, int64_t begin,
                          int64_t rows, std::vector<int64_t> shape) {
  auto staged = at::empty(shape, at::TensorOptions().dtype(t.dtype)).contiguous();
  detail::read_rows(dir, t, begin, begin + rows, staged);
  return staged;
}

// This rank's rows of `p` (in the frame of its TP slice under tensor parallelism) from the
// stored full tensor `st`: rows at the slice's offset for a row slice, whole rows cut to the
// slice's columns for a column slice.
at::Tensor read_local(const std::string& dir, const StoredTensor& st, const std::string& name,
                      const ShardedTensor& p, const tp::Layout& tp) {
  if (p.shard_dim != 0 && !p.replicated) {
    // A chunk of another dim (Shard(d > 0)): every row of the tensor, then this rank's chunk.
    ShardedTensor whole = p;
    whole.local = at::empty(p.global_shape, p.local.options().device(at::kMeta));
    whole.row_offset = 0;
    whole.shard_dim = 0;
    return detail::chunk_for(read_local(dir, st, name, whole, tp), p).contiguous();
  }
  const tp::TpSlice* slice = tp.slice_of(name);
  if (!slice || p.global_shape.size() != slice->full.size()) {
    return read_rows_like(dir, st, p.row_offset, p.rows(), p.local.sizes().vec());
  }
  auto shape = p.local.sizes().vec();
  int64_t begin = p.row_offset;
  if (slice->dim == 0) {
    begin += slice->chunk.offset;
  } else {
    shape[slice->dim] = slice->full[slice->dim];
  }
  auto rows = read_rows_like(dir, st, begin, p.rows(), shape);
  if (slice->dim == 0) return rows;
  return rows.narrow(slice->dim, slice->chunk.offset, slice->chunk.length).contiguous();
}

// The shape `st` must have for the model's `p`: the full tensor of a TP slice, else p's own.
const std::vector<int64_t>& stored_shape(const std::string& name, const ShardedTensor& p,
                                         const tp::Layout& tp) {
  const tp::TpSlice* slice = tp.slice_of(name);
  return slice && p.global_shape.size() == slice->full.size() ? slice->full : p.global_shape;
}

Staged stage(const std::string& dir, const Manifest& m, const torch::nn::Module& model,
             const torch::optim::Optimizer* optimizer, const tp::Layout& tp,
             const std::function<bool(const std::string&)>& filter) {
  const std::string kind = optimizer ? optimizer_kind(*optimizer) : "none";
  std::unordered_map<std::string, const StoredTensor*> stored;
  for (const auto& t : m.tensors) stored[t.name] = &t;
  std::unordered_set<std::string> used;
  Staged out;
  auto find = [&](const std::string& name) -> const StoredTensor& {
    auto it = stored.find(name);
    if (it == stored.end()) {
      throw CheckpointError(fmt::format(
          "{} has no tensor '{}' (the model's){}", dir, name,
          m.partial ? "; it is a partial checkpoint (saved with SaveOptions::filter): load it "
                      "with a LoadOptions::filter that keeps only what it holds (a LoRA run's "
                      "adapters: fsdp::models::is_lora_parameter)"
                    : ""));
    }
    used.insert(name);
    return *it->second;
  };
  auto model_state = get_model_state_dict(model);
  if (optimizer) {
    std::unordered_set<const void*> params;
    for (const auto& p : model.parameters()) params.insert(p.unsafeGetTensorImpl());
    for (const auto& group : optimizer->param_groups()) {
      for (const auto& p : group.params()) {
        if (!params.count(p.unsafeGetTensorImpl())) {
          throw CheckpointError(
              "the optimizer holds a parameter that is not the model's (pass the optimizer built "
              "over this model's parameters: FSDPModule::parameters())");
        }
      }
    }
  }
  std::unordered_map<std::string, const ShardedTensor*> by_name;
  for (const auto& [name, t] : model_state) {
    if (filter && !filter(name)) continue;
    by_name[name] = &t;
    const StoredTensor& st = find(name);
    const auto& want = stored_shape(name, t, tp);
    if (st.dtype != t.local.scalar_type() || st.shape != want) {
      throw CheckpointError(fmt::format("tensor '{}' is {} {} in {}, the model's is {} {}", name,
                                        c10::toString(st.dtype), shape_str(st.shape), dir,
                                        c10::toString(t.local.scalar_type()), shape_str(want)));
    }
    out.copies.emplace_back(t.local, read_local(dir, st, name, t, tp));
  }
  if (optimizer) {
    if (m.optimizer != kind) {
      throw CheckpointError(
          fmt::format("{} holds the state of optimizer '{}', not of '{}'", dir, m.optimizer, kind));
    }
    for (const auto& t : m.tensors) {
      const auto hash = t.name.rfind('#');
      if (hash == std::string::npos) continue;
      used.insert(t.name);
      if (!passes(filter, t.name)) continue;
      const auto param = by_name.find(t.name.substr(0, hash));
      ShardedTensor s;
      s.global_shape = t.shape;
      if (hash > 0 && param != by_name.end() &&
          t.shape == stored_shape(param->first, *param->second, tp)) {
        // Sharded like its parameter: this rank's rows only (of its TP slice), in the frame
        // of the parameter's shard.
        const ShardedTensor& p = *param->second;
        s.local = read_local(dir, t, param->first, p, tp).to(p.local.device());
        s.global_shape = p.global_shape;
        s.row_offset = p.row_offset;
        s.replicated = p.replicated;
        s.shard_dim = p.shard_dim;
        s.shard_group = p.shard_group;
        s.replica = p.replica;
        s.replicate_group = p.replicate_group;
      } else {
        s.local = read_rows_like(dir, t, 0, t.shape.empty() ? 1 : t.shape[0], t.shape);
        s.replicated = true;
      }
      out.optimizer.emplace_back(t.name, std::move(s));
    }
    // Checkpoints of format 1 kept AdamW's step counts in the manifest.
    for (const auto& [name, step] : m.optimizer_steps) {
      if (!passes(filter, name + "#step")) continue;
      ShardedTensor s;
      s.local = at::scalar_tensor(step, at::kLong);
      s.replicated = true;
      out.optimizer.emplace_back(name + "#step", std::move(s));
    }
  }
  for (const auto& t : m.tensors) {
    const bool state = t.name.find('#') != std::string::npos;
    if (!used.count(t.name) && !(state && !optimizer) && passes(filter, t.name)) {
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
  return load_checkpoint(path, model, optimizer, pg, LoadOptions{});
}

CheckpointInfo load_checkpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg,
                               const LoadOptions& options) {
  FSDP_CHECK_ARG(pg != nullptr, "load_checkpoint: the process group is null");
  FSDP_CHECK_ARG(!options.tp.active() || options.tp.dp != nullptr,
                 "load_checkpoint: LoadOptions::tp needs its dp group (the ranks of this rank's "
                 "tensor-parallel index, DeviceMesh::dp_group(); llama::tp_layout(config, "
                 "mesh.tp, mesh.dp_group())): the optimizer state is installed within it");
  const std::string& dir = path;
  Manifest m;
  Staged staged;
  agree_on<CheckpointError>(*pg, fmt::format("load_checkpoint {}", path), [&] {
    const auto manifest_path = join(dir, detail::kManifestName);
    m = detail::manifest_from_json(io::read_file(manifest_path), manifest_path);
    // The directory's name and the manifest's step must agree: a resume takes its step (the
    // learning-rate schedule, the data position) from the manifest.
    const std::string trimmed = io::without_trailing_slash(dir);
    const auto named = step_of(trimmed.substr(trimmed.find_last_of('/') + 1));
    if (named && *named != m.step) {
      throw CheckpointError(fmt::format("{} says step {}, its directory's name step {}",
                                        manifest_path, m.step, *named));
    }
    staged = stage(dir, m, model, optimizer, options.tp, options.filter);
  });
  // Every rank has everything: apply.
  {
    at::NoGradGuard no_grad;
    for (auto& [target, value] : staged.copies) target.copy_(value);
  }
  // Every rank read exactly its rows: the state installs without moving data (shards of a dim
  // other than 0 excepted: they pass through rows, dim_shards.h).
  // Under tensor parallelism only the ranks of one TP index hold slices of the same shapes.
  if (optimizer && options.filter) {
    // The state of the parameters the filter leaves out passes through as it is (installing
    // a state dict resets every parameter it has no entries for).
    for (auto& e : get_optimizer_state_dict(model, *optimizer)) {
      const auto owner = owner_of(e.first);
      if (!owner.empty() && !options.filter(owner)) staged.optimizer.push_back(std::move(e));
    }
  }
  if (optimizer) {
    set_optimizer_state_dict(model, *optimizer, staged.optimizer,
                             options.tp.active() ? options.tp.dp : pg);
  }
  return CheckpointInfo{path, m.step, m.world_size, m.metadata, m.partial};
}

}  // namespace fsdp
