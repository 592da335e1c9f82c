// Model state dicts (state_dict.h): sharded ones read from the units through the module tree,
// full ones gathered one tensor at a time, and setting either back at any layout.
#include "fsdp/checkpoint/state_dict.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>
#include <unordered_set>

#include "checkpoint/agreement.h"
#include "runtime/collectives.h"
#include "runtime/local_shards.h"
#include "util/check.h"

namespace fsdp {

ShardedStateDict get_model_state_dict(const torch::nn::Module& model) {
  ShardedStateDict out;
  for (auto& s : detail::local_shards(model)) {
    ShardedTensor t;
    t.local = s.tensor;
    t.global_shape = s.full_shape;
    t.row_offset = s.row_begin;
    t.replicated = s.replicated;
    t.shard_group = s.shard_group;
    t.replica = s.replica;
    out.emplace_back(s.name, std::move(t));
  }
  for (const auto& b : model.named_buffers(/*recurse=*/true)) {
    ShardedTensor t;
    t.local = b.value();
    t.global_shape = b.value().sizes().vec();
    t.replicated = true;
    out.emplace_back(b.key(), std::move(t));
  }
  return out;
}

void for_each_full_tensor(const torch::nn::Module& model, const ProcessGroupPtr& world,
                          const FullStateDictOptions& options,
                          const std::function<void(const std::string&, const at::Tensor&)>& visit) {
  FSDP_CHECK_ARG(world != nullptr, "for_each_full_tensor: the process group is null");
  const bool receives = !options.rank0_only || world->rank() == 0;
  for (const auto& [name, s] : get_model_state_dict(model)) {
    // Every rank joins every gather (in the same order), whether it keeps the result or not.
    // A tensor of the visitor's own: a replicated one is the live parameter or buffer, copied
    // (such tensors are the small ones: norms and biases outside units, buffers).
    at::Tensor full = s.replicated ? s.local.detach().clone()
                                   : detail::all_gather_full(*s.shard_group, s.local, s.global_shape);
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

}  // namespace fsdp
