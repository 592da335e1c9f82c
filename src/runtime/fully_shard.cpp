// fully_shard's entry points: argument checks, the state a module carries (its "fsdp_state"
// child), and FSDPModule's methods.
#include "fsdp/runtime/fully_shard.h"

#include <fmt/ranges.h>
#include <torch/csrc/autograd/graph_task.h>

#include <unordered_map>
#include <unordered_set>
#if defined(__GLIBC__)  // defined by the standard headers above on glibc systems
#include <malloc.h>
#endif

#include "fsdp/errors.h"
#include "runtime/unit_state.h"
#include "util/check.h"

namespace fsdp {
namespace detail {
namespace {

// The module owns its state through a parameterless child module, so the state (and the
// process groups it holds) lives exactly as long as the module: nothing global keeps an MPI or
// NCCL communicator alive past the model, and the state is found through the module tree
// (FSDP2's _get_module_fsdp_state), never through a process-wide map.
class StateHolderImpl : public torch::nn::Module {
 public:
  explicit StateHolderImpl(std::shared_ptr<UnitState> state)
      : torch::nn::Module("fsdp::UnitState"), state_(std::move(state)) {}
  const std::shared_ptr<UnitState>& state() const { return state_; }

 private:
  std::shared_ptr<UnitState> state_;
};

constexpr const char* kStateHolderName = "fsdp_state";

// Every unit inside `module` (not itself), and the outermost of them: they become its children.
struct InnerUnits {
  std::vector<std::shared_ptr<UnitState>> direct;
  std::vector<std::shared_ptr<UnitState>> all;
};

// Each unit once: a unit of several modules is found through each of them.
InnerUnits inner_units(const std::vector<std::shared_ptr<torch::nn::Module>>& modules) {
  InnerUnits out;
  std::unordered_set<const UnitState*> seen;
  for (const auto& module : modules) {
    for (const auto& sub : module->modules(/*include_self=*/false)) {
      auto s = unit_state_of(*sub);
      if (!s || !seen.insert(s.get()).second) continue;
      out.all.push_back(s);
      if (s->is_root()) out.direct.push_back(s);
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

// Whether `m` is one of the unit's modules or inside one.
bool module_within_unit(const torch::nn::Module* m, const UnitState& unit) {
  const auto modules = unit.modules();
  if (modules.empty()) return true;  // destroyed: nothing to compare against
  for (const auto& own : modules) {
    if (module_within(m, *own)) return true;
  }
  return false;
}

// The module's parameters that no inner unit owns and that are not ignored, each tensor once (a
// tensor registered under several names, a tied embedding and head, is one parameter, as in
// FSDP2), checked: not shared with an inner unit, at least 1-d, on the group's device type,
// floating, one dtype.
std::vector<std::pair<std::string, at::Tensor>> collect_own_params(
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules, const ProcessGroup& pg,
    const InnerUnits& inner, const std::vector<at::Tensor>& ignored, bool offload) {
  std::unordered_map<const c10::TensorImpl*, const UnitState*> owned;
  for (const auto& s : inner.all) {
    for (const auto& p : s->group().params()) owned[p.param().unsafeGetTensorImpl()] = s.get();
  }
  std::unordered_set<const c10::TensorImpl*> skip;
  for (const auto& t : ignored) skip.insert(t.unsafeGetTensorImpl());
  // Every (qualified name, registering module) of every tensor, to tell a tensor an inner unit
  // owns alone from one it shares with a module outside that unit.
  using Registration = std::pair<std::string, const torch::nn::Module*>;
  std::unordered_map<const c10::TensorImpl*, std::vector<Registration>> registrations;
  for (const auto& module : modules) {
    for (const auto& item : module->named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
      for (const auto& p : item.value()->named_parameters(/*recurse=*/false)) {
        auto name = item.key().empty() ? p.key() : item.key() + "." + p.key();
        registrations[p.value().unsafeGetTensorImpl()].emplace_back(name, item.value().get());
      }
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::unordered_set<const c10::TensorImpl*> seen;  // across the modules: a tensor they share
  for (const auto& module_ptr : modules) {
    const torch::nn::Module& module = *module_ptr;
    for (const auto& item : module.named_parameters(/*recurse=*/true)) {
      const at::Tensor& p = item.value();
      const auto* impl = p.unsafeGetTensorImpl();
      if (!seen.insert(impl).second || skip.count(impl)) continue;  // another name; ignored
      auto owner = owned.find(impl);
      if (owner != owned.end()) {
        for (const auto& [name, where] : registrations[impl]) {
          FSDP_CHECK_ARG(module_within_unit(where, *owner->second),
                         "fully_shard: parameter '{}' of {} is the same tensor as a parameter of "
                         "the inner fully_shard unit {}, which shards it alone; a tensor shared "
                         "between two units (a tied embedding and output head in different "
                         "units) is not supported: keep the modules that share it in one unit",
                         name, module.name(), owner->second->describe());
        }
        continue;  // an inner unit's parameter
      }
      const ShardMark* other = shard_mark(p);
      FSDP_CHECK_ARG(other == nullptr,
                     "fully_shard: parameter '{}' of {} already belongs to another fully_shard "
                     "unit, {}, that is not inside this module; shard inner modules before the "
                     "modules that contain them, and do not share parameters between units",
                     item.key(), module.name(), other ? other->owner : "");
      FSDP_CHECK_ARG(p.dim() >= 1,
                     "fully_shard: parameter '{}' is a scalar (0-d); FSDP shards dim 0, so "
                     "give it shape [1]",
                     item.key());
      // With offload the shards go to host memory: the parameters may start there.
      FSDP_CHECK_ARG(p.device().type() == pg.device_type() || (offload && p.is_cpu()),
                     "fully_shard: parameter '{}' is on {} but the {} process group works on {} "
                     "tensors",
                     item.key(), p.device().str(), pg.backend_name(),
                     c10::DeviceTypeName(pg.device_type(), true));
      FSDP_CHECK_ARG(p.is_floating_point(),
                     "fully_shard: parameter '{}' has dtype {}; expected a floating dtype",
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
  }
  return params;
}

// shard_placement_fn's dim of each parameter, checked: within the tensor's dims, and a dim other
// than 0 divides evenly by the shard group (FSDP2 refuses uneven Shard(d > 0) too).
std::vector<int> placement_dims(const std::vector<std::pair<std::string, at::Tensor>>& params,
                                const FullyShardOptions& options, int world) {
  std::vector<int> dims(params.size(), 0);
  if (!options.shard_placement_fn) return dims;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    const auto want = options.shard_placement_fn(name, p);
    if (!want) continue;
    const int64_t ndim = p.dim();
    const int64_t d = *want < 0 ? *want + ndim : *want;
    FSDP_CHECK_ARG(d >= 0 && d < ndim,
                   "fully_shard: shard_placement_fn placed parameter '{}' (shape {}) on dim {}; "
                   "it has {} dims",
                   name, fmt::format("{}", fmt::join(p.sizes(), "x")), *want, ndim);
    FSDP_CHECK_ARG(d == 0 || p.size(d) % world == 0,
                   "fully_shard: shard_placement_fn placed parameter '{}' (shape {}) on dim {}, "
                   "whose {} does not divide by the shard group's {} ranks; a dim other than 0 "
                   "must shard evenly (as in FSDP2): pick another dim or 0",
                   name, fmt::format("{}", fmt::join(p.sizes(), "x")), d, p.size(d), world);
    dims[i] = static_cast<int>(d);
  }
  return dims;
}

// reshard_after_forward_ranks: the group of consecutive ranks this rank keeps its rows in
// between forward and backward (a collective split of the shard group).
ProcessGroupPtr post_forward_group(const ProcessGroupPtr& shard, int ranks) {
  if (ranks <= 0) return nullptr;
  FSDP_CHECK_ARG(ranks > 1 && ranks < shard->size() && shard->size() % ranks == 0,
                 "fully_shard: reshard_after_forward_ranks {} must divide the shard group's {} "
                 "ranks and lie strictly between 1 and {}",
                 ranks, shard->size(), shard->size());
  return shard->split(shard->rank() / ranks);
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

}  // namespace

std::shared_ptr<UnitState> unit_state_of(const torch::nn::Module& module) {
  for (const auto& child : module.named_children()) {
    if (child.key() != kStateHolderName) continue;
    auto holder = std::dynamic_pointer_cast<StateHolderImpl>(child.value());
    return holder ? holder->state() : nullptr;
  }
  return nullptr;
}

void shard_module(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
                  FullyShardOptions options) {
  FSDP_CHECK_ARG(module != nullptr, "fully_shard: the module is empty (a null holder)");
  shard_modules({module}, mesh, std::move(options));
}

void shard_modules(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                   const DeviceMesh& mesh, FullyShardOptions options) {
  FSDP_CHECK_ARG(!modules.empty(), "fully_shard: the list of modules is empty");
  for (size_t i = 0; i < modules.size(); ++i) {
    FSDP_CHECK_ARG(modules[i] != nullptr, "fully_shard: module {} of the list is empty", i);
    for (size_t j = 0; j < modules.size(); ++j) {
      if (i == j) continue;
      FSDP_CHECK_ARG(modules[i] != modules[j] && !module_within(modules[j].get(), *modules[i]),
                     "fully_shard: module {} ({}) of the list {} module {} ({}); the modules of "
                     "one unit must be disjoint",
                     j, modules[j]->name(),
                     modules[i] == modules[j] ? "is the same as" : "is inside", i,
                     modules[i]->name());
    }
  }
  FSDP_CHECK_ARG(mesh.shard != nullptr, "fully_shard: the process group is null");
  FSDP_CHECK_ARG(!mesh.replicate || mesh.replicate->device_type() == mesh.shard->device_type(),
                 "fully_shard: the replicate group's device type ({}) differs from the shard "
                 "group's ({})",
                 c10::DeviceTypeName(mesh.replicate->device_type(), true),
                 c10::DeviceTypeName(mesh.shard->device_type(), true));
  for (const auto& module : modules) {
    FSDP_CHECK_ARG(!unit_state_of(*module),
                   "fully_shard: {} was already sharded; call fully_shard once per module",
                   module->name());
  }
  DeviceMesh m = mesh;
  // One replica is plain FSDP: no all-reduce to issue.
  if (m.replicate && m.replicate->size() == 1) m.replicate.reset();
  auto inner = inner_units(modules);
  auto params = collect_own_params(modules, *m.shard, inner, options.ignored_params,
                                   options.offload_policy.has_value());
  const auto shard_dims = placement_dims(params, options, m.shard->size());
  auto post_forward = post_forward_group(m.shard, options.reshard_after_forward_ranks);
  auto state = std::make_shared<UnitState>(modules, m, std::move(options), std::move(params),
                                           std::move(post_forward), shard_dims);
  for (auto& c : inner.direct) state->adopt(c);
  // Every member carries the state, so each finds the unit (its forward, FSDPModule) and an
  // outer unit finds it through any of them.
  for (const auto& module : modules) {
    module->register_module(kStateHolderName, std::make_shared<StateHolderImpl>(state));
  }
  release_freed_heap_memory();
}

}  // namespace detail

// --- FSDPModule ---------------------------------------------------------------------------------

std::shared_ptr<detail::UnitState> FSDPModule::state(const char* what) const {
  auto s = module_ ? detail::unit_state_of(*module_) : nullptr;
  FSDP_CHECK_ARG(s != nullptr, "{}: fully_shard was not applied to this module", what);
  s->tree().recover_if_stale();
  return s;
}

std::vector<FSDPModule> fully_shard(const std::vector<FSDPModule>& modules,
                                    const ProcessGroupPtr& pg, FullyShardOptions options) {
  return fully_shard(modules, flat_mesh(pg), std::move(options));
}

std::vector<FSDPModule> fully_shard(const std::vector<FSDPModule>& modules, const DeviceMesh& mesh,
                                    FullyShardOptions options) {
  std::vector<std::shared_ptr<torch::nn::Module>> nn;
  for (const auto& m : modules) nn.push_back(m.nn_module());
  detail::shard_modules(nn, mesh, std::move(options));
  return modules;
}

std::vector<at::Tensor> FSDPModule::parameters() const {
  FSDP_CHECK_ARG(module_ != nullptr, "FSDPModule::parameters: the module is empty");
  return unique_parameters(*module_);
}

namespace {

// The units `recurse` reaches from `s`: itself, and every unit inside it.
std::vector<detail::UnitState*> units_of(detail::UnitState& s, bool recurse) {
  std::vector<detail::UnitState*> out{&s};
  for (size_t i = 0; recurse && i < out.size(); ++i) {
    for (const auto& c : out[i]->children()) out.push_back(c.get());
  }
  return out;
}

// Settings must not change while a backward of the tree runs: a half-applied switch would
// desynchronise ranks. A backward is running when the tree's callback is queued and alive, or
// when this thread is inside any autograd graph task (a hook that runs before the tree's first).
void check_not_in_backward(detail::UnitState& s, const std::string& what) {
  const bool in_graph_task = torch::autograd::get_current_graph_task_id() != -1;
  FSDP_CHECK_ARG(!in_graph_task && !s.tree().backward_running(),
                 "fsdp: {} on {} while a backward of its tree is running (called from a hook?); "
                 "call it before the forward of the micro-batch it applies to",
                 what, s.describe());
}

}  // namespace

UnshardHandle FSDPModule::unshard(bool async_op) {
  auto s = state("FSDPModule::unshard");
  s->group().unshard();
  UnshardHandle handle(s);
  if (!async_op) handle.wait();
  return handle;
}

void UnshardHandle::wait() {
  if (!state_) return;
  state_->group().wait_for_unshard();
  state_.reset();
}

void FSDPModule::reshard() { state("FSDPModule::reshard")->group().reshard(); }

TrainingState FSDPModule::training_state() const {
  return state("FSDPModule::training_state")->group().training_state();
}

ShardedState FSDPModule::sharded_state() const {
  return state("FSDPModule::sharded_state")->group().sharded_state();
}

void FSDPModule::set_requires_gradient_sync(bool sync, bool recurse) {
  auto s = state("set_requires_gradient_sync");
  check_not_in_backward(*s, fmt::format("set_requires_gradient_sync({})", sync));
  for (auto* u : units_of(*s, recurse)) u->group().settings().requires_gradient_sync = sync;
}

void FSDPModule::set_requires_all_reduce(bool all_reduce, bool recurse) {
  auto s = state("set_requires_all_reduce");
  check_not_in_backward(*s, fmt::format("set_requires_all_reduce({})", all_reduce));
  for (auto* u : units_of(*s, recurse)) u->group().settings().requires_all_reduce = all_reduce;
}

void FSDPModule::set_reshard_after_forward(bool reshard, bool recurse) {
  auto s = state("set_reshard_after_forward");
  check_not_in_backward(*s, fmt::format("set_reshard_after_forward({})", reshard));
  for (auto* u : units_of(*s, recurse)) u->group().settings().reshard_after_forward = reshard;
}

void FSDPModule::set_reshard_after_backward(bool reshard, bool recurse) {
  auto s = state("set_reshard_after_backward");
  check_not_in_backward(*s, fmt::format("set_reshard_after_backward({})", reshard));
  for (auto* u : units_of(*s, recurse)) u->group().settings().reshard_after_backward = reshard;
}

namespace {
std::vector<std::weak_ptr<detail::UnitState>> states_of(const std::vector<FSDPModule>& units,
                                                        const char* what) {
  std::vector<std::weak_ptr<detail::UnitState>> out;
  for (const auto& u : units) {
    auto s = u.nn_module() ? detail::unit_state_of(*u.nn_module()) : nullptr;
    FSDP_CHECK_ARG(s != nullptr, "{}: a module in the list is not sharded by fully_shard", what);
    out.push_back(s);
  }
  return out;
}
}  // namespace

void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& units) {
  auto s = state("set_modules_to_forward_prefetch");
  s->prefetch_settings().forward = states_of(units, "set_modules_to_forward_prefetch");
  s->prefetch_settings().explicit_forward = true;
}

void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& units) {
  auto s = state("set_modules_to_backward_prefetch");
  s->prefetch_settings().backward = states_of(units, "set_modules_to_backward_prefetch");
  s->prefetch_settings().explicit_backward = true;
}

void FSDPModule::set_is_last_backward(bool last) {
  state("set_is_last_backward")->tree().is_last_backward = last;
}

void FSDPModule::set_gradient_divide_factor(double factor) {
  FSDP_CHECK_ARG(std::isfinite(factor) && factor > 0,
                 "set_gradient_divide_factor: the factor must be a positive finite number, got {}",
                 factor);
  state("set_gradient_divide_factor")->group().settings().gradient_divide_factor = factor;
}

void FSDPModule::set_reduce_scatter_unused_params(bool on, bool recurse) {
  auto s = state("set_reduce_scatter_unused_params");
  check_not_in_backward(*s, fmt::format("set_reduce_scatter_unused_params({})", on));
  for (auto* u : units_of(*s, recurse)) u->group().settings().reduce_scatter_unused_params = on;
}

void FSDPModule::set_custom_all_gather(AllGatherComm comm, bool recurse) {
  auto s = state("set_custom_all_gather");
  check_not_in_backward(*s, "set_custom_all_gather");
  // From each unit's next gather on: parameters gathered now (kept for a backward to come)
  // stay as they are.
  for (auto* u : units_of(*s, recurse)) u->group().settings().hooks.all_gather = comm;
}

void FSDPModule::set_custom_reduce_scatter(ReduceScatterComm comm, bool recurse) {
  auto s = state("set_custom_reduce_scatter");
  check_not_in_backward(*s, "set_custom_reduce_scatter");
  for (auto* u : units_of(*s, recurse)) u->group().settings().hooks.reduce_scatter = comm;
}

void FSDPModule::set_all_reduce_hook(AllReduceHook hook, bool recurse) {
  auto s = state("set_all_reduce_hook");
  check_not_in_backward(*s, "set_all_reduce_hook");
  for (auto* u : units_of(*s, recurse)) u->group().settings().hooks.all_reduce = hook;
}

MemoryStats FSDPModule::memory_stats() const { return state("memory_stats")->memory_stats(); }

CommStats FSDPModule::comm_stats() const {
  return CommStats{state("comm_stats")->group().comm().exposed()};
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

}  // namespace fsdp
