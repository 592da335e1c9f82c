// Optimizer state dicts (state_dict.h): each parameter's state tensors sharded like the
// parameter, its scalars and the param groups' options replicated.
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/dim_shards.h"
#include "checkpoint/optimizer_state.h"
#include "checkpoint/redistribute.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/comm/agree.h"
#include "util/check.h"

namespace fsdp {
namespace {

constexpr const char* kKindName = "#optimizer";
constexpr const char* kGroupPrefix = "#param_groups.";

ShardedTensor replicated(at::Tensor t) {
  ShardedTensor s;
  s.global_shape = t.sizes().vec();
  s.local = std::move(t);
  s.replicated = true;
  return s;
}

at::Tensor string_bytes(const std::string& s) {
  auto t = at::empty({static_cast<int64_t>(s.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), s.data(), s.size());
  return t;
}

std::string bytes_string(const at::Tensor& t) {
  auto c = t.to(at::kCPU).contiguous();
  return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()),
                     static_cast<size_t>(c.numel()));
}

// The model's parameters (their state dict entries), and that the optimizer's are among them.
ShardedStateDict params_of(const torch::nn::Module& model, const torch::optim::Optimizer& optimizer,
                           const char* what) {
  std::unordered_set<const void*> ids;
  for (const auto& p : model.parameters(/*recurse=*/true)) ids.insert(p.unsafeGetTensorImpl());
  ShardedStateDict params;
  for (auto& [name, t] : get_model_state_dict(model)) {
    if (ids.count(t.local.unsafeGetTensorImpl()))
      params.emplace_back(name, std::move(t));  // not buffers
  }
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      FSDP_CHECK_ARG(ids.count(p.unsafeGetTensorImpl()),
                     "{}: the optimizer holds a parameter that is not the model's (build the "
                     "optimizer over this model's parameters: FSDPModule::parameters())",
                     what);
    }
  }
  return params;
}

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  return detail::optimizer_kind(optimizer);
}

ShardedStateDict get_optimizer_state_dict(const torch::nn::Module& model,
                                          const torch::optim::Optimizer& optimizer) {
  const std::string kind = detail::optimizer_kind(optimizer);
  ShardedStateDict out;
  out.emplace_back(kKindName, replicated(string_bytes(kind)));
  for (const auto& [name, p] : params_of(model, optimizer, "get_optimizer_state_dict")) {
    auto state = detail::read_param_state(optimizer, kind, p.local);
    if (!state) continue;
    for (const auto& [field, t] : state->tensors) {
      ShardedTensor s = p;  // sharded like its parameter
      s.local = t;
      out.emplace_back(name + "#" + field, std::move(s));
    }
    for (const auto& [field, v] : state->scalars) {
      out.emplace_back(name + "#" + field, replicated(at::scalar_tensor(v, at::kLong)));
    }
  }
  const auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) {
    out.emplace_back(kGroupPrefix + std::to_string(g),
                     replicated(detail::group_options_bytes(groups[g])));
  }
  return out;
}

void set_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                              const ShardedStateDict& state, const ProcessGroupPtr& world) {
  FSDP_CHECK_ARG(world != nullptr, "set_optimizer_state_dict: the process group is null");
  const char* what = "set_optimizer_state_dict";
  std::string kind;
  ShardedStateDict params;
  // Per parameter: its fields and where they are in `state`.
  std::map<std::string, std::vector<std::pair<std::string, size_t>>> fields;
  std::vector<std::pair<size_t, size_t>> groups;  // (param group, entry)
  // Checked on every rank before any state changes: the documented InvalidArgument, the same
  // on every rank.
  agree_on<InvalidArgument>(*world, what, [&] {
    kind = detail::optimizer_kind(optimizer);
    params = params_of(model, optimizer, what);
    std::unordered_map<std::string, const ShardedTensor*> by_param;
    for (const auto& [name, p] : params) by_param[name] = &p;
    for (size_t i = 0; i < state.size(); ++i) {
      const auto& [name, t] = state[i];
      if (name == kKindName) {
        const std::string saved = bytes_string(t.local);
        FSDP_CHECK_ARG(saved == kind,
                       "{}: the state dict holds the state of a {} optimizer, "
                       "this one is {}",
                       what, saved, kind);
        continue;
      }
      if (name.rfind(kGroupPrefix, 0) == 0) {
        const size_t g = std::stoul(name.substr(std::strlen(kGroupPrefix)));
        FSDP_CHECK_ARG(g < optimizer.param_groups().size(),
                       "{}: the state dict holds options of param group {}, the optimizer has {} "
                       "groups",
                       what, g, optimizer.param_groups().size());
        groups.emplace_back(g, i);
        continue;
      }
      const auto hash = name.rfind('#');
      FSDP_CHECK_ARG(hash != std::string::npos && by_param.count(name.substr(0, hash)),
                     "{}: '{}' is not '<parameter>#<state>' for a parameter of the model", what,
                     name);
      const ShardedTensor& p = *by_param[name.substr(0, hash)];
      FSDP_CHECK_ARG(t.global_shape.empty() || t.global_shape == p.global_shape,
                     "{}: '{}' has another shape than its parameter", what, name);
      fields[name.substr(0, hash)].emplace_back(name.substr(hash + 1), i);
    }
  });

  // Targets: this rank's rows of each state tensor (shaped like the parameter's rows), and the
  // scalars; filled by one redistribution in name order (the same on every rank).
  // Shards of a dim other than 0 (the parameter's, or the state's as saved) move as rows of the
  // same sharding and become chunks after (dim_shards.h), collectively in name order.
  std::vector<detail::Move> moves;
  std::vector<std::pair<const ShardedTensor*, std::string>> owners;
  std::vector<std::pair<size_t, ShardedTensor>> to_chunks;  // move index, the rows filled
  for (const auto& [name, p] : params) {
    auto it = fields.find(name);
    if (it == fields.end()) continue;
    for (const auto& [field, i] : it->second) {
      const ShardedTensor src = detail::as_rows(state[i].second);
      const bool scalar = src.global_shape.empty();
      at::Tensor target =
          scalar ? at::empty({}, src.local.options().dtype(at::kLong))
                 : at::empty(p.local.sizes(), p.local.options().dtype(src.local.scalar_type()));
      if (!scalar && p.shard_dim != 0 && !p.replicated) {
        ShardedTensor rows = detail::rows_target(p, src.local.scalar_type());
        moves.push_back({name + "#" + field, src.local, src.row_offset, rows.local, rows.row_offset,
                         src.global_shape});
        to_chunks.emplace_back(moves.size() - 1, std::move(rows));
      } else {
        moves.push_back({name + "#" + field, src.local, src.row_offset, target,
                         scalar ? 0 : p.row_offset, src.global_shape});
      }
      owners.emplace_back(&p, field);
    }
  }
  detail::redistribute(moves, *world);
  for (auto& [k, rows] : to_chunks) {
    const ShardedTensor& p = *owners[k].first;
    ShardedTensor chunk = p;
    chunk.local = at::empty(p.local.sizes(), p.local.options().dtype(rows.local.scalar_type()));
    detail::rows_to_chunk(rows, chunk);
    moves[k].target = chunk.local;
  }

  std::map<const ShardedTensor*, detail::ParamState> states;
  for (size_t i = 0; i < moves.size(); ++i) {
    auto& st = states[owners[i].first];
    if (moves[i].global_shape.empty()) {
      st.scalars[owners[i].second] = moves[i].target.item<int64_t>();
    } else {
      st.tensors[owners[i].second] = moves[i].target;
    }
  }
  for (const auto& [name, p] : params) {
    auto it = states.find(&p);
    detail::write_param_state(
        optimizer, kind, p.local,
        it == states.end() ? std::nullopt : std::optional<detail::ParamState>(it->second));
  }
  for (const auto& [g, i] : groups) {
    detail::restore_group_options(optimizer.param_groups()[g], state[i].second.local);
  }
}

}  // namespace fsdp
