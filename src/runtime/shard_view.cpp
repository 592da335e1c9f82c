// The public shard view (fsdp/runtime/sharded_tensor.h): what this rank holds of each
// parameter, read from the units through the module tree or from a shard's own marked storage.
#include <unordered_map>
#include <unordered_set>

#include "fsdp/runtime/sharded_tensor.h"
#include "runtime/unit_state.h"
#include "util/check.h"

namespace fsdp {
namespace {

NamedShards shards_of(const torch::nn::Module& model, bool allow_gathered) {
  // The units of the model, by the tensors they shard (through the module tree).
  std::unordered_map<const c10::TensorImpl*, const detail::FsdpParam*> owner;
  for (const auto& sub : model.modules(/*include_self=*/true)) {
    auto s = detail::unit_state_of(*sub);
    if (!s) continue;
    s->tree().recover_if_stale();
    for (const auto& p : s->group().params()) owner[p.param().unsafeGetTensorImpl()] = &p;
  }
  NamedShards out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    auto it = owner.find(p.unsafeGetTensorImpl());
    if (it == owner.end()) {
      ShardedTensor whole;
      whole.local = p;
      whole.global_shape = p.sizes().vec();
      whole.replicated = true;
      out.emplace_back(item.key(), std::move(whole));
      continue;
    }
    FSDP_CHECK_ARG(allow_gathered || !it->second->holds_full(),
                   "parameter '{}' is gathered (full) now; checkpoints read shards: call "
                   "them between steps, or reshard() after unshard()",
                   item.key());
    out.emplace_back(item.key(), it->second->view());
  }
  return out;
}

}  // namespace

NamedShards parameter_shards(const torch::nn::Module& model) {
  return shards_of(model, /*allow_gathered=*/false);
}

NamedShards parameter_gradient_shards(const torch::nn::Module& model) {
  return shards_of(model, /*allow_gathered=*/true);
}

std::optional<ShardedTensor> shard_of(const at::Tensor& param) {
  const detail::ShardMark* mark = detail::shard_mark(param);
  if (!mark) return std::nullopt;
  ShardedTensor v;
  v.local = param;
  v.global_shape = mark->full_shape;
  v.row_offset = mark->shard_dim == 0 ? mark->row_offset : 0;
  v.shard_dim = mark->shard_dim;
  v.shard_group = mark->shard_group.lock();
  v.replicate_group = mark->replicate_group.lock();
  v.replica = mark->replica;
  if (!v.shard_group) return std::nullopt;  // its unit is gone
  return v;
}

}  // namespace fsdp
