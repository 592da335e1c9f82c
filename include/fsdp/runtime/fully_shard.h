// fully_shard: FSDP2's per-parameter sharding for libtorch modules.
//
//   for (auto& layer : model->layers) fsdp::fully_shard(layer, pg, {mp});  // Unit members
//   auto sharded = fsdp::fully_shard(model, pg, {mp});      // the root
//   torch::optim::AdamW opt(sharded.parameters(), ...);     // this rank's shards, each once
//   auto loss = loss_fn(sharded(tokens)); loss.backward(); opt.step();
//
// libtorch modules have no forward hooks, so a unit's forward must be called through
// fsdp::Unit<Holder>: a thin holder that runs FSDP's pre-forward (gather this unit's
// parameters), the module's own forward, then post-forward (free them, hook the backward).
// Before fully_shard is applied, a Unit is a plain pass-through, so the same model class runs
// unsharded (the single-process reference) and sharded. See docs/design.md.
//
// Semantics (FSDP2's, torch/distributed/fsdp/_fully_shard/):
// - Each parameter is sharded on dim 0 (layout.h); parameters() returns the shards,
//   named_parameters() keeps the names, and the Tensor objects stay the same (set_data), so any
//   libtorch optimizer keeps sharded state.
// - One communication group per fully_shard call: its parameters minus those of units already
//   sharded inside it (children are sharded first) and minus ignored_params.
// - Forward: one all-gather per unit before its forward, in param_dtype; the next unit's
//   gather is issued before this one computes (forward prefetch, from the previous step's
//   order or set_modules_to_forward_prefetch). After forward the full parameters are freed
//   unless reshard_after_forward is false (the root's default).
// - Backward: a unit whose parameters were freed is gathered again when the gradient reaches
//   its outputs (and the unit before it is prefetched); once its gradients exist, one
//   reduce-scatter in reduce_dtype, averaged over ranks (or divided by the gradient divide
//   factor), lands in each parameter's grad() in its original dtype, adding to a gradient
//   already there (accumulation). At the end of backward all reductions are waited for.
// - Gradients: grad() of a parameter is always its sharded gradient (or undefined), whatever
//   the step is doing: zero_grad() (set_to_none or not) or any edit of grad() between or
//   inside steps means what it means without FSDP. Full gradients are FSDP's own until they are
//   reduced.
// - Trainable parameters are read at each forward: freezing or unfreezing (requires_grad)
//   after fully_shard changes what is reduced from the next step on; the reduce-scatter carries
//   exactly the parameters that take a gradient.
// - Failures: a forward or backward that throws (a user's hook, a shape error, an out-of-memory
//   the caller catches) leaves the tree to be reset before its next forward: parameters
//   resharded, orders and per-backward state cleared, reductions in flight finished (their
//   gradients land, as autograd's would have). A forward whose loss is never backpropagated is
//   the same. The next step trains as if the failed one had stopped there.
// - Accumulation without communication: set_requires_gradient_sync(false) keeps gradients
//   unsharded until a backward with sync on reduces them once.
// - Activation checkpointing (FullyShardOptions::activation_checkpointing): the unit keeps
//   only its inputs; backward gathers its parameters and recomputes it.
// - Hybrid sharding (a DeviceMesh instead of a group): sharded within a replica, gradients
//   reduce-scattered there and then all-reduced across replicas (device_mesh.h).
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fsdp/comm/device_mesh.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/detail/forward_args.h"
#include "fsdp/runtime/comm_hooks.h"
#include "fsdp/runtime/lifecycle.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/stats.h"
#include "fsdp/runtime/unique_parameters.h"

namespace fsdp {

namespace detail {
class UnitState;

// The state fully_shard attached to `module` (its "fsdp_state" child), or null.
std::shared_ptr<UnitState> unit_state_of(const torch::nn::Module& module);
// fully_shard's work (src/runtime/fully_shard.cpp).
void shard_module(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
                  FullyShardOptions options);
// Several modules as one unit (fully_shard of a list).
void shard_modules(const std::vector<std::shared_ptr<torch::nn::Module>>& modules,
                   const DeviceMesh& mesh, FullyShardOptions options);

// A unit's method on its tensor arguments, in order; its outputs flattened to a list (empty
// when the outputs are not made of tensors).
using ForwardFn = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;
struct ForwardSpec {
  const char* output_type = "";  // typeid name of the outputs, for messages
  bool tensor_outputs = true;    // a Tensor, a vector or a tuple of Tensors
  bool replayable = true;        // `fn` may run again (the recompute of checkpointing)
};
// Runs `fn` as the unit's forward: gathers before, casts floating inputs to param_dtype,
// checkpoints when the unit does, hooks the outputs for the backward, frees after. The one
// entry point of every forward through a Unit (src/runtime/forward.cpp).
std::vector<at::Tensor> run_forward(UnitState& state, std::vector<at::Tensor> inputs,
                                    const ForwardFn& fn, const ForwardSpec& spec);
// The same, naming the module called: one member of a unit of several modules (fully_shard of
// a list). The overload above (0.2.0's, kept for programs built against it) names the first.
std::vector<at::Tensor> run_forward(UnitState& state, std::vector<at::Tensor> inputs,
                                    const ForwardFn& fn, const ForwardSpec& spec,
                                    const torch::nn::Module* member);
}  // namespace detail

// FSDP2's UnshardHandle: wait() completes an unshard(/*async_op=*/true).
class UnshardHandle {
 public:
  UnshardHandle() = default;
  explicit UnshardHandle(std::shared_ptr<detail::UnitState> state) : state_(std::move(state)) {}
  // Completes the gather; the full parameters are in place afterwards. A no-op when done.
  void wait();

 private:
  std::shared_ptr<detail::UnitState> state_;
};

// The methods of a sharded module, FSDP2's FSDPModule. A handle: copies refer to the same
// module, whose FSDP state lives in the module itself.
class FSDPModule {
 public:
  FSDPModule() = default;
  explicit FSDPModule(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}

  // The module (null for an empty handle).
  const std::shared_ptr<torch::nn::Module>& nn_module() const { return module_; }
  bool is_sharded() const { return module_ && detail::unit_state_of(*module_) != nullptr; }
  // This rank's parameter shards, each tensor once (unique_parameters): give these to the
  // optimizer.
  std::vector<at::Tensor> parameters() const;

  // Gathers this unit's full parameters (not recursive). async_op: returns at once; the
  // handle's wait() (or the unit's next forward) completes the gather. The parameters stay
  // full until reshard() or the end of the next backward.
  UnshardHandle unshard(bool async_op = false);
  // Frees the full parameters, registering the shards again (not recursive).
  void reshard();
  // Where this unit is in the step and what its parameters hold now (lifecycle.h): for
  // debugging and tests.
  TrainingState training_state() const;
  ShardedState sharded_state() const;

  // Off: the backwards that follow keep their gradients unsharded on every rank (full size, in
  // the reduce dtype) instead of reduce-scattering them; the first backward with sync on
  // reduces everything accumulated, once. For gradient accumulation: off for all micro-batches
  // but the last. With hybrid sharding it governs the all-reduce across replicas too.
  void set_requires_gradient_sync(bool sync, bool recurse = true);
  // Hybrid sharding: off reduce-scatters within the replica but skips the all-reduce across
  // replicas (accumulation with less traffic between machines); the reduced shards are kept
  // and all-reduced once by the first backward with it on.
  void set_requires_all_reduce(bool all_reduce, bool recurse = true);
  // Refused (InvalidArgument), like every switch below, while a backward of the tree runs.
  void set_reshard_after_forward(bool reshard, bool recurse = true);
  // Off: the full parameters stay after this unit's backward, so that the next forward needs
  // no gather (accumulation over micro-batches). They must be resharded before the optimizer
  // steps: the end of a backward with it back on, or reshard().
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  // Explicit prefetch: after this unit gathers for its forward (backward), the gathers of
  // `units` are issued, in order, instead of the one the recorded order would pick.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& units);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& units);
  // Whether the next backward is the last before the optimizer step (default true): on the
  // last backward FSDP finishes every reduction at its end; otherwise reductions may stay in
  // flight into the next micro-batch (set on the root).
  void set_is_last_backward(bool last);
  // Gradients are divided by `factor` instead of the number of ranks (the shard group's size
  // times the replicas). Not recursive.
  void set_gradient_divide_factor(double factor);
  // On: a unit of this tree whose parameters got no gradient on this rank in a backward still
  // joins the reduce-scatter, with zeros, so that ranks whose graphs differ (an expert or a
  // branch used on some ranks only) neither hang nor mismatch. Every rank must set the same.
  void set_reduce_scatter_unused_params(bool on, bool recurse = true);

  // Communication hooks (comm_hooks.h), FSDP2's of the same names. Each replaces the unit's own
  // collective (an empty function restores it) from the next one issued; every rank must set
  // the same. Not recursive unless `recurse` (FSDP2 sets them on one unit). Refused while a
  // backward of the tree runs. Any hook turns off the one-rank shortcut (no gather, gradients
  // straight into grad()): the hooks run over one rank too, so a quantized gather rounds the
  // weights at world 1 as well (its blocks follow each rank's buffer, so the rounding itself
  // differs between world sizes). The regather after forward over reshard_after_forward_ranks
  // moves the forward's gathered values as they are, not through the custom all-gather.
  void set_custom_all_gather(AllGatherComm comm, bool recurse = false);
  void set_custom_reduce_scatter(ReduceScatterComm comm, bool recurse = false);
  void set_all_reduce_hook(AllReduceHook hook, bool recurse = false);

  // This rank's accounting: the unit and every unit inside it, and its tree (stats.h).
  MemoryStats memory_stats() const;
  // This rank's communication time for the tree the unit belongs to.
  CommStats comm_stats() const;

 protected:
  // The state, or InvalidArgument naming `what` when fully_shard was not applied.
  std::shared_ptr<detail::UnitState> state(const char* what) const;

  std::shared_ptr<torch::nn::Module> module_;
};

// A module held for FSDP: call it like the module; `->` reaches the module itself.
template <typename Holder>
class Unit : public FSDPModule {
 public:
  Unit() : Unit(nullptr) {}
  Unit(std::nullptr_t) {}  // NOLINT: mirrors ModuleHolder
  Unit(Holder holder)      // NOLINT: implicit, like a holder
      : FSDPModule(holder.ptr()), holder_(std::move(holder)) {}
  // From register_module's result, so `units.push_back(register_module("b", Block(...)))`.
  Unit(std::shared_ptr<typename Holder::ContainedType> impl)  // NOLINT: implicit
      : Unit(Holder(std::move(impl))) {}

  auto* operator->() { return holder_.get(); }
  const auto* operator->() const { return holder_.get(); }
  Holder& module() { return holder_; }
  const Holder& module() const { return holder_; }

  // The module's forward, through FSDP once it is sharded.
  template <typename... Args>
  auto operator()(Args&&... args) {
    auto impl = holder_.ptr();
    return run([impl](auto&&... a) { return impl->forward(std::forward<decltype(a)>(a)...); },
               std::forward<Args>(args)...);
  }

  // Another method of the module run as a forward (FSDP2's register_fsdp_forward_method):
  // `unit.call(&EncoderImpl::encode, x)` gathers the parameters around it as forward does.
  template <typename Method, typename... Args>
  auto call(Method method, Args&&... args) {
    auto impl = holder_.ptr();
    return run(
        [impl, method](auto&&... a) { return ((*impl).*method)(std::forward<decltype(a)>(a)...); },
        std::forward<Args>(args)...);
  }

 private:
  template <typename F, typename... Args>
  auto run(F f, Args&&... args) {
    using Out = std::invoke_result_t<F&, Args&&...>;
    static_assert(!std::is_reference_v<Out>,
                  "fsdp::Unit: a method run through FSDP must return by value");
    // The state is looked up once it exists and kept: a lookup walks the module's children
    // (libtorch copies them), and a module's state never changes once fully_shard made it.
    auto unit_state = state_cache_.lock();
    if (!unit_state && module_) {
      unit_state = detail::unit_state_of(*module_);
      state_cache_ = unit_state;
    }
    if (!unit_state) return f(std::forward<Args>(args)...);
    using Stored = std::tuple<std::decay_t<Args>...>;
    auto stored = std::make_shared<Stored>(std::forward<Args>(args)...);
    std::vector<at::Tensor> inputs;
    detail::take_tensors(*stored, inputs);
    detail::ForwardSpec spec{typeid(Out).name(), detail::TensorOutputs<Out>::value,
                             std::is_copy_constructible_v<Stored>};
    if constexpr (detail::TensorOutputs<Out>::value) {
      detail::ForwardFn fn = [f, stored](const std::vector<at::Tensor>& tensors) mutable {
        return detail::flatten_outputs(detail::apply_with_tensors(f, *stored, tensors));
      };
      return detail::unflatten_outputs<Out>(
          detail::run_forward(*unit_state, std::move(inputs), fn, spec, module_.get()));
    } else if constexpr (std::is_void_v<Out>) {
      detail::ForwardFn fn = [f, stored](const std::vector<at::Tensor>& tensors) mutable {
        detail::apply_with_tensors(f, *stored, tensors);
        return std::vector<at::Tensor>{};
      };
      detail::run_forward(*unit_state, std::move(inputs), fn, spec, module_.get());
    } else {
      std::optional<Out> out;
      detail::ForwardFn fn = [&out, f, stored](const std::vector<at::Tensor>& tensors) mutable {
        out.emplace(detail::apply_with_tensors(f, *stored, tensors));
        return std::vector<at::Tensor>{};
      };
      detail::run_forward(*unit_state, std::move(inputs), fn, spec, module_.get());
      return std::move(*out);
    }
  }

  Holder holder_{nullptr};
  std::weak_ptr<detail::UnitState> state_cache_;
};

// Shards `holder`'s parameters over `pg` (see the file comment) and returns it as a Unit.
// The module keeps its FSDP state in a parameterless child module named "fsdp_state", so the
// state lives as long as the module does.
// Throws InvalidArgument, before touching any parameter, when: the module was already sharded,
// a child unit is sharded after its parent, a tensor is shared with a unit outside it, its
// parameters mix dtypes, one is a scalar, a parameter is not on pg's device type or not
// floating. A unit left with no parameters of its own (all inside child units) is fine: it
// only coordinates.
template <typename Holder>
Unit<Holder> fully_shard(Holder holder, const ProcessGroupPtr& pg, FullyShardOptions options = {}) {
  detail::shard_module(holder.ptr(), flat_mesh(pg), std::move(options));
  return Unit<Holder>(std::move(holder));
}

// Hybrid sharding (HSDP): shards over mesh.shard; after each reduce-scatter of the gradients
// within the shard group, the reduced shard is all-reduced across mesh.replicate, so that every
// gradient is the average over the whole world (device_mesh.h). With one replica this is the
// overload above on mesh.shard.
template <typename Holder>
Unit<Holder> fully_shard(Holder holder, const DeviceMesh& mesh, FullyShardOptions options = {}) {
  detail::shard_module(holder.ptr(), mesh, std::move(options));
  return Unit<Holder>(std::move(holder));
}

// The same for a module the model already holds as a Unit: `fully_shard(model->layers[i], pg)`.
template <typename Holder>
Unit<Holder> fully_shard(Unit<Holder>& unit, const ProcessGroupPtr& pg,
                         FullyShardOptions options = {}) {
  return fully_shard(unit.module(), pg, std::move(options));
}
template <typename Holder>
Unit<Holder> fully_shard(Unit<Holder>& unit, const DeviceMesh& mesh,
                         FullyShardOptions options = {}) {
  return fully_shard(unit.module(), mesh, std::move(options));
}

// FSDP2's fully_shard([m1, m2]): several modules' parameters as one unit (the final norm with
// the output head): one all-gather before the first of them runs its
// forward, freed after the last one's (each member once per forward, through its fsdp::Unit),
// and one reduce-scatter once all their gradients are in. The members must be disjoint (none
// inside another) and not sharded yet. Returns the members, each an FSDPModule of the same unit
// (its switches act on the whole unit; parameters() gives that member's). An outer unit sharded
// later adopts it once, as any inner unit. A member called twice counts once; a unit some member
// of which did not run completes (frees) at the end of the root's forward. Like any unit, the
// unit must run on every rank of its group in each forward (ranks that skip it would not join
// its all-gather).
std::vector<FSDPModule> fully_shard(const std::vector<FSDPModule>& modules,
                                    const ProcessGroupPtr& pg, FullyShardOptions options = {});
std::vector<FSDPModule> fully_shard(const std::vector<FSDPModule>& modules, const DeviceMesh& mesh,
                                    FullyShardOptions options = {});

}  // namespace fsdp
