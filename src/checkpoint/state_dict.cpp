// Model state dicts (state_dict.h): sharded ones read from the units through the module tree,
// full ones gathered one tensor at a time, and setting either back at any layout.
#include "fsdp/checkpoint/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>
#include <unordered_set>

#include "checkpoint/dim_shards.h"
#include "checkpoint/redistribute.h"
#include "fsdp/comm/agree.h"
#include "fsdp/runtime/layout.h"
#include "util/check.h"
#include "util/format.h"

namespace fsdp {

ShardedStateDict get_model_state_dict(const torch::nn::Module& model) {
  ShardedStateDict out = parameter_shards(model);
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    ShardedTensor t;
    t.local = b.value();
    t.global_shape = b.value().sizes().vec();
    t.replicated = true;
    out.emplace_back(b.key(), std::move(t));
  }
  return out;
}

namespace {

// The whole tensor `s` is rows of, on every rank of its shard group: one all-gather of every
// rank's rows padded to ceil(dim0 / ranks) (layout.h's rule, the one fully_shard shards by).
at::Tensor gather_full(const ShardedTensor& s) {
  if (s.shard_dim != 0) return detail::gather_chunks(s);  // Shard(d > 0): chunks of dim d
  ProcessGroup& pg = *s.shard_group;
  const int world = pg.size();
  ParamShape shape{s.global_shape.at(0), 1};
  for (size_t d = 1; d < s.global_shape.size(); ++d) shape.row_numel *= s.global_shape[d];
  const int64_t padded = shape.padded_numel(world);
  // Communicated on the group's device, which is not the shard's under CPU offload (host shards,
  // a GPU group: NCCL takes device tensors only); the full tensor lands where the shard lives.
  const auto comm = s.local.options().device(pg.device());
  auto send = at::zeros({padded}, comm);
  if (s.local.numel() > 0) send.narrow(0, 0, s.local.numel()).copy_(s.local.detach().reshape(-1));
  auto all = at::empty({world * padded}, comm);
  pg.all_gather(all, send)->wait();
  auto full = at::empty(s.global_shape, s.local.options());
  auto full_rows = full.view({shape.dim0, shape.row_numel});
  auto per_rank = all.view({world, padded});
  for (int r = 0; r < world; ++r) {
    const auto rows = shard_range(shape.dim0, world, r);
    if (rows.rows() == 0) continue;
    full_rows.narrow(0, rows.begin, rows.rows())
        .copy_(per_rank[r]
                   .narrow(0, 0, rows.rows() * shape.row_numel)
                   .view({rows.rows(), shape.row_numel}));
  }
  return full;
}

}  // namespace

void for_each_full_tensor(const torch::nn::Module& model, const ProcessGroupPtr& world,
                          const FullStateDictOptions& options,
                          const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  FSDP_CHECK_ARG(world != nullptr, "for_each_full_tensor: the process group is null");
  const bool receives = !options.rank0_only || world->rank() == 0;
  for (const auto& [name, s] : get_model_state_dict(model)) {
    if (options.filter && !options.filter(name)) continue;
    // Every rank joins every gather (in the same order), whether it keeps the result or not.
    // A tensor of the visitor's own: a replicated one is the live parameter or buffer, copied
    // (such tensors are the small ones: norms and biases outside units, buffers).
    at::Tensor full = s.replicated ? s.local.detach().clone() : gather_full(s);
    if (const tp::TpSlice* slice = options.tp.slice_of(name);
        slice && full.dim() == static_cast<int64_t>(slice->full.size())) {
      full = tp::gather_dim(full, slice->dim, slice->full[slice->dim], options.tp.group);
    }
    if (!receives) continue;
    if (options.dtype && full.is_floating_point()) full = full.to(*options.dtype);
    if (options.cpu_offload) full = full.cpu();
    visit(name, full);
  }
}

FullStateDict get_full_model_state_dict(const torch::nn::Module& model,
                                        const ProcessGroupPtr& world,
                                        const FullStateDictOptions& options) {
  FullStateDict out;
  for_each_full_tensor(model, world, options, [&](const std::string& name, const at::Tensor& t) {
    out.emplace_back(name, t);
  });
  return out;
}

namespace {

using detail::shape_str;

// Every name of every tensor of the model -> the name its state dict uses (a tied tensor's
// other names resolve to its first).
std::unordered_map<std::string, std::string> state_dict_names(const torch::nn::Module& model) {
  std::unordered_map<const c10::TensorImpl*, std::string> first;
  std::unordered_map<std::string, std::string> out;
  for (const auto& p : model.named_parameters(/*recurse=*/true)) {
    auto it = first.emplace(p.value().unsafeGetTensorImpl(), p.key()).first;
    out[p.key()] = it->second;
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) out[b.key()] = b.key();
  return out;
}

// Looks every entry of `given` (by any of the model's names) up against the model's state dict
// `want`: each of `want` must be present once with its global shape, and `given` may hold
// nothing else. Returns the index into `given` for each entry of `want`; InvalidArgument naming
// the first problem otherwise.
template <typename Entries, typename ShapeOf>
std::vector<size_t> match(const torch::nn::Module& model, const ShardedStateDict& want,
                          const Entries& given, const ShapeOf& shape_of, const char* what) {
  const auto names = state_dict_names(model);
  std::unordered_map<std::string, size_t> by_name;
  for (size_t i = 0; i < given.size(); ++i) {
    auto it = names.find(given[i].first);
    FSDP_CHECK_ARG(it != names.end(),
                   "{}: the state dict holds '{}', which the model does not have", what,
                   given[i].first);
    FSDP_CHECK_ARG(by_name.emplace(it->second, i).second,
                   "{}: the state dict holds '{}' twice (under two names of one tensor)", what,
                   it->second);
  }
  std::vector<size_t> index;
  for (const auto& [name, t] : want) {
    auto it = by_name.find(name);
    FSDP_CHECK_ARG(it != by_name.end(), "{}: the state dict has no '{}' (the model's)", what, name);
    const auto shape = shape_of(given[it->second].second);
    FSDP_CHECK_ARG(shape == t.global_shape, "{}: '{}' is {} in the state dict, the model's is {}",
                   what, name, shape_str(shape), shape_str(t.global_shape));
    index.push_back(it->second);
  }
  return index;
}

}  // namespace

void set_model_state_dict(torch::nn::Module& model, const ShardedStateDict& state,
                          const ProcessGroupPtr& world) {
  FSDP_CHECK_ARG(world != nullptr, "set_model_state_dict: the process group is null");
  auto want = get_model_state_dict(model);
  std::vector<size_t> index;
  agree_on<InvalidArgument>(*world, "set_model_state_dict", [&] {
    index = match(
        model, want, state, [](const ShardedTensor& t) { return t.global_shape; },
        "set_model_state_dict");
  });
  // Rows move; shards of another dim (Shard(d > 0), on either side) go through rows of the same
  // sharding, converted collectively in state order (every rank's).
  std::vector<detail::Move> moves;
  std::vector<std::pair<ShardedTensor, const ShardedTensor*>> to_chunks;
  for (size_t i = 0; i < want.size(); ++i) {
    const ShardedTensor src = detail::as_rows(state[index[i]].second);
    const ShardedTensor& dst = want[i].second;
    if (dst.shard_dim != 0 && !dst.replicated) {
      to_chunks.emplace_back(detail::rows_target(dst, dst.local.scalar_type()), &dst);
      const ShardedTensor& rows = to_chunks.back().first;
      moves.push_back({want[i].first, src.local, src.row_offset, rows.local, rows.row_offset,
                       dst.global_shape});
    } else {
      moves.push_back(
          {want[i].first, src.local, src.row_offset, dst.local, dst.row_offset, dst.global_shape});
    }
  }
  detail::redistribute(moves, *world);
  for (const auto& [rows, dst] : to_chunks) detail::rows_to_chunk(rows, *dst);
}

void set_model_state_dict(torch::nn::Module& model, const FullStateDict& state,
                          const ProcessGroupPtr& world, bool rank0_only) {
  FullStateDictOptions options;
  options.rank0_only = rank0_only;
  set_model_state_dict(model, state, world, options);
}

void set_model_state_dict(torch::nn::Module& model, const FullStateDict& state,
                          const ProcessGroupPtr& world, const FullStateDictOptions& options) {
  FSDP_CHECK_ARG(world != nullptr, "set_model_state_dict: the process group is null");
  const bool rank0_only = options.rank0_only;
  const bool reads = !rank0_only || world->rank() == 0;
  auto want = get_model_state_dict(model);
  // Under TP the state dict holds the unsplit tensors: a slice's entry must have the full
  // shape, and each rank keeps its slice of it.
  std::vector<const tp::TpSlice*> slices(want.size(), nullptr);
  ShardedStateDict shapes = want;
  for (size_t i = 0; i < want.size(); ++i) {
    const tp::TpSlice* slice = options.tp.slice_of(want[i].first);
    if (slice && want[i].second.global_shape.size() == slice->full.size()) {
      slices[i] = slice;
      shapes[i].second.global_shape = slice->full;
    }
  }
  std::vector<size_t> index;
  agree_on<InvalidArgument>(*world, "set_model_state_dict", [&] {
    if (reads) {
      index = match(
          model, shapes, state, [](const at::Tensor& t) { return t.sizes().vec(); },
          "set_model_state_dict");
    }
  });
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < want.size(); ++i) {
    const ShardedTensor& dst = want[i].second;
    at::Tensor full;
    if (rank0_only) {
      // One tensor at a time from rank 0: every rank holds at most one full tensor.
      full = reads
                 ? state[index[i]].second.to(world->device(), dst.local.scalar_type()).contiguous()
                 : at::empty(shapes[i].second.global_shape,
                             dst.local.options().device(world->device()));
      world->broadcast(full, 0)->wait();
    } else {
      full = state[index[i]].second;
    }
    if (slices[i])
      full = full.narrow(slices[i]->dim, slices[i]->chunk.offset, slices[i]->chunk.length);
    if (dst.local.dim() == 0) {
      dst.local.copy_(full.reshape({}));
    } else if (dst.shard_dim != 0 && !dst.replicated) {
      dst.local.copy_(detail::chunk_for(full, dst));
    } else if (dst.rows() > 0) {
      dst.local.copy_(full.narrow(0, dst.row_offset, dst.rows()));
    }
  }
}

}  // namespace fsdp
