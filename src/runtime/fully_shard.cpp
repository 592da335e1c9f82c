// fully_shard's entry points: argument checks, the registry that maps a module to its unit
// state, and the functions Unit<Holder> calls around a forward.
#include <mutex>
#include <unordered_map>
#include <unordered_set>
#if defined(__GLIBC__)  // defined by the standard headers above on glibc systems
#include <malloc.h>
#endif

#include "fsdp/detail/unit_hooks.h"
#include "fsdp/errors.h"
#include "fsdp/unique_parameters.h"
#include "runtime/local_shards.h"
#include "runtime/unit_state.h"

namespace fsdp {
namespace detail {
namespace {

// The module owns its state through a parameterless child module, so the state (and the
// process group it holds) lives exactly as long as the module: no global keeps an MPI or NCCL
// communicator alive past the model. The registry only finds states, by module address;
// entries whose module died are dropped when met, so a recycled address never sees a stale one.
class StateHolderImpl : public torch::nn::Module {
 public:
  explicit StateHolderImpl(std::shared_ptr<UnitState> state) : state_(std::move(state)) {}

 private:
  std::shared_ptr<UnitState> state_;
};

constexpr const char* kStateHolderName = "fsdp_state";

struct Registry {
  std::mutex mu;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<UnitState>> states;
  // Parameters (by TensorImpl) that some unit already shards.
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<UnitState>> owned;
};

Registry& registry() {
  static Registry r;
  return r;
}

std::shared_ptr<UnitState> lookup_locked(Registry& r, const torch::nn::Module* m) {
  auto it = r.states.find(m);
  if (it == r.states.end()) return nullptr;
  auto state = it->second.lock();
  if (!state || !state->module_is(m)) {
    r.states.erase(it);
    return nullptr;
  }
  return state;
}

}  // namespace

std::shared_ptr<UnitState> find_unit_state(const torch::nn::Module* module) {
  if (!module) return nullptr;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  return lookup_locked(r, module);
}

namespace {

struct ChildUnits {
  std::vector<std::shared_ptr<UnitState>> direct;  // become this unit's children
  std::unordered_set<const UnitState*> all;        // every unit inside the module
};

// Units already sharded inside `module`: the outermost become its children, and all of them
// own their parameters.
ChildUnits collect_child_units(Registry& r, const torch::nn::Module& module) {
  ChildUnits out;
  for (const auto& sub : module.modules(/*include_self=*/false)) {
    if (auto s = lookup_locked(r, sub.get())) {
      out.all.insert(s.get());
      if (!s->has_parent()) out.direct.push_back(s);
    }
  }
  return out;
}

// Whether `m` is `root` or inside it.
bool module_within(const torch::nn::Module* m, const torch::nn::Module& root) {
  for (const auto& sub : root.modules(/*include_self=*/true)) {
    if (sub.get() == m) return true;
  }
  return false;
}

// The module's parameters that no inner unit owns, each tensor once (a tensor registered under
// several names, a tied embedding and head, is one parameter, as in FSDP2), checked: sharded
// nowhere else, not shared with an inner unit, at least 1-d, on the group's device type,
// floating, one dtype.
std::vector<std::pair<std::string, at::Tensor>> collect_own_params(Registry& r,
                                                                   const torch::nn::Module& module,
                                                                   const ProcessGroup& pg,
                                                                   const ChildUnits& children) {
  // Every (qualified name, registering module) of every tensor, to tell a tensor an inner unit
  // owns alone from one it shares with a module outside that unit.
  using Registration = std::pair<std::string, const torch::nn::Module*>;
  std::unordered_map<const c10::TensorImpl*, std::vector<Registration>> registrations;
  for (const auto& item : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
      auto name = item.key().empty() ? p.key() : item.key() + "." + p.key();
      registrations[p.value().unsafeGetTensorImpl()].emplace_back(name, item.value().get());
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;  // another name of one tensor
    auto owner = r.owned.find(p.unsafeGetTensorImpl());
    if (owner != r.owned.end()) {
      auto s = owner->second.lock();
      if (s && children.all.count(s.get())) {
        auto inner = s->module();
        for (const auto& [name, where] : registrations[p.unsafeGetTensorImpl()]) {
          if (inner && !module_within(where, *inner)) {
            throw InvalidArgument(fmt::format(
                "fully_shard: parameter '{}' of {} is the same tensor as a parameter of the "
                "inner fully_shard unit {}, which shards it alone; a tensor shared between two "
                "units (a tied embedding and output head in different units) is not supported: "
                "keep the modules that share it in one unit",
                name, module.name(), inner->name()));
          }
        }
        continue;  // a child's parameter
      }
      if (s) {
        auto other = s->module();
        throw InvalidArgument(fmt::format(
            "fully_shard: parameter '{}' of {} already belongs to another fully_shard unit, {}, "
            "that is not inside this module; shard inner modules before the modules that "
            "contain them, and do not share parameters between units",
            item.key(), module.name(), other ? other->name() : "(destroyed)"));
      }
    }
    FSDP_CHECK_ARG(p.dim() >= 1,
                   "fully_shard: parameter '{}' is a scalar (0-d); FSDP shards dim 0, so "
                   "give it shape [1]",
                   item.key());
    FSDP_CHECK_ARG(p.device().type() == pg.device_type(),
                   "fully_shard: parameter '{}' is on {} but the {} process group works on {} "
                   "tensors",
                   item.key(), p.device().str(), pg.backend_name(),
                   c10::DeviceTypeName(pg.device_type(), true));
    FSDP_CHECK_ARG(p.is_floating_point(),
                   "fully_shard: parameter '{}' has dtype {}; expected a "
                   "floating dtype",
                   item.key(), c10::toString(p.scalar_type()));
    if (!params.empty()) {
      FSDP_CHECK_ARG(p.scalar_type() == params.front().second.scalar_type(),
                     "fully_shard: {} mixes parameter dtypes ('{}' is {}, '{}' is {}); one "
                     "unit is one communication buffer of one dtype: shard them in separate "
                     "units",
                     module.name(), params.front().first,
                     c10::toString(params.front().second.scalar_type()), item.key(),
                     c10::toString(p.scalar_type()));
    }
    params.emplace_back(item.key(), p);
  }
  return params;
}

// Sharding just freed the unit's full parameters. glibc keeps freed blocks below its mmap
// threshold (which it raises, up to 32 MiB, as large blocks are freed) in the heap, resident;
// a model sharded block by block as it is built would keep every block's full size resident
// that way (measured: 1312 MiB per rank at start-up at world 4 on a 1.07 GB model, 833 MiB
// with this). malloc_trim hands free heap pages back to the kernel; it costs well under a
// millisecond here.
void release_freed_heap_memory() {
#if defined(__GLIBC__)
  malloc_trim(0);
#endif
}

// Makes `state` findable from its module and its parameters, and gives the module ownership.
void register_unit(Registry& r, const std::shared_ptr<torch::nn::Module>& module,
                   const std::shared_ptr<UnitState>& state,
                   const std::vector<std::pair<std::string, at::Tensor>>& params) {
  for (const auto& item : params) r.owned[item.second.unsafeGetTensorImpl()] = state;
  r.states[module.get()] = state;
  module->register_module(kStateHolderName, std::make_shared<StateHolderImpl>(state));
}

}  // namespace

std::shared_ptr<UnitState> create_unit_state(const std::shared_ptr<torch::nn::Module>& module,
                                             ProcessGroupPtr pg, ProcessGroupPtr replicate,
                                             FullyShardOptions options) {
  FSDP_CHECK_ARG(module != nullptr, "fully_shard: the module is empty (a null holder)");
  FSDP_CHECK_ARG(pg != nullptr, "fully_shard: the process group is null");
  FSDP_CHECK_ARG(!replicate || replicate->device_type() == pg->device_type(),
                 "fully_shard: the replicate group's device type ({}) differs from the shard "
                 "group's ({})",
                 c10::DeviceTypeName(replicate->device_type(), true),
                 c10::DeviceTypeName(pg->device_type(), true));
  // One replica is plain FSDP: no all-reduce to issue.
  if (replicate && replicate->size() == 1) replicate.reset();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  FSDP_CHECK_ARG(!lookup_locked(r, module.get()),
                 "fully_shard: {} was already sharded; call fully_shard once per module",
                 module->name());
  auto children = collect_child_units(r, *module);
  auto params = collect_own_params(r, *module, *pg, children);
  auto state = std::make_shared<UnitState>(module, std::move(pg), std::move(replicate),
                                           std::move(options), params);
  for (auto& c : children.direct) state->adopt(c);
  register_unit(r, module, state, params);
  release_freed_heap_memory();
  return state;
}

std::vector<LocalShard> local_shards(const torch::nn::Module& model) {
  std::vector<LocalShard> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    LocalShard shard{item.key(), p, p.sizes().vec(), 0, p.dim() == 0 ? 1 : p.size(0), true,
                     nullptr,    0};
    auto owner = r.owned.find(p.unsafeGetTensorImpl());
    auto state = owner == r.owned.end() ? nullptr : owner->second.lock();
    if (state) {
      const ParamGroup& group = state->group();
      for (const auto& fp : group.params()) {
        if (!fp.param().is_same(p)) continue;
        FSDP_CHECK_ARG(!fp.holds_full(),
                       "parameter '{}' is gathered (full) now; checkpoints read shards: call "
                       "them between steps, or reshard() after unshard()",
                       item.key());
        const ShardRange& rows = fp.range(group.pg()->rank());
        shard.full_shape = fp.full_shape();
        shard.row_begin = rows.begin;
        shard.row_end = rows.begin + rows.rows();
        shard.replicated = false;
        shard.shard_group = group.pg();
        shard.replica = group.replicate() ? group.replicate()->rank() : 0;
      }
    }
    out.push_back(std::move(shard));
  }
  return out;
}

std::pair<ProcessGroupPtr, ProcessGroupPtr> sharding_groups_of(const at::Tensor& param) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto owner = r.owned.find(param.unsafeGetTensorImpl());
  auto state = owner == r.owned.end() ? nullptr : owner->second.lock();
  if (!state) return {nullptr, nullptr};
  return {state->group().pg(), state->group().replicate()};
}

void pre_forward(UnitState& state) { state.pre_forward(); }
at::Tensor cast_forward_input(UnitState& state, const at::Tensor& input) {
  return state.cast_forward_input(input);
}
void post_forward_output(UnitState& state, at::Tensor& output) {
  state.post_forward_output(output);
}
void post_forward(UnitState& state) { state.post_forward(); }
void unshard(UnitState& state) { state.unshard(); }
void reshard(UnitState& state) { state.reshard(); }
MemoryStats memory_stats(const UnitState& state) { return state.memory_stats(); }
void set_requires_gradient_sync(UnitState& state, bool sync, bool recurse) {
  state.set_requires_gradient_sync(sync, recurse);
}
bool checkpoints_forward(const UnitState& state) { return state.checkpoints_forward(); }
CommStats comm_stats(const UnitState& state) { return state.comm_stats(); }

}  // namespace detail

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

void throw_not_checkpointable(const char* output_type) {
  throw InvalidArgument(
      fmt::format("fsdp: activation_checkpointing needs the unit's forward to return a Tensor, a "
                  "std::vector<Tensor> or a std::tuple of Tensors; this one returns {}",
                  c10::demangle(output_type)));
}

void throw_not_sharded(const char* what) {
  throw InvalidArgument(fmt::format("{}: fully_shard was not applied to this module", what));
}

}  // namespace fsdp
