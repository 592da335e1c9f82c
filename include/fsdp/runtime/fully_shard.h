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
// - Each parameter is sharded on dim 0 (shard_range: ceil(d0 / N) rows per rank, trailing ranks
//   fewer or none); parameters() returns the shards, named_parameters() keeps the names, and the
//   Tensor objects stay the same (set_data), so any libtorch optimizer keeps sharded state.
// - One communication group per fully_shard call: its parameters minus those of units already
//   sharded inside it (children are sharded first).
// - Forward: one all-gather per unit before its forward, in param_dtype; the next unit's
//   gather is issued before this one computes (forward prefetch, from the previous step's
//   order). After forward the full parameters are freed unless reshard_after_forward is false
//   (the root's default).
// - Backward: a unit whose parameters were freed is gathered again when the gradient reaches
//   its outputs (and the unit before it is prefetched); once its gradients exist, one
//   reduce-scatter in reduce_dtype, averaged over ranks, lands in each parameter's grad() in
//   its original dtype, adding to a gradient already there (accumulation). At the end of
//   backward all reductions are waited for; units without gradients neither hang nor corrupt.
// - Accumulation without communication: set_requires_gradient_sync(false) keeps gradients
//   unsharded until a backward with sync on reduces them once.
// - Activation checkpointing (FullyShardOptions::activation_checkpointing): the unit keeps
//   only its inputs; backward gathers its parameters and recomputes it.
// - Hybrid sharding (a DeviceMesh instead of a group): sharded within a replica, gradients
//   reduce-scattered there and then all-reduced across replicas (device_mesh.h).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "fsdp/comm_stats.h"
#include "fsdp/detail/checkpoint_args.h"
#include "fsdp/detail/unit_hooks.h"
#include "fsdp/device_mesh.h"
#include "fsdp/fully_shard_options.h"
#include "fsdp/memory_stats.h"
#include "fsdp/process_group.h"
#include "fsdp/unique_parameters.h"

namespace fsdp {

namespace detail {
template <typename T>
decltype(auto) cast_arg(UnitState& state, T&& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return cast_forward_input(state, arg);
  } else {
    return std::forward<T>(arg);
  }
}

inline void visit_outputs(UnitState& state, at::Tensor& t) { post_forward_output(state, t); }
inline void visit_outputs(UnitState& state, std::vector<at::Tensor>& ts) {
  for (auto& t : ts) post_forward_output(state, t);
}
template <typename... T>
void visit_outputs(UnitState& state, std::tuple<T...>& tuple) {
  std::apply([&](auto&... elems) { (visit_outputs(state, elems), ...); }, tuple);
}
template <typename T>
void visit_outputs(UnitState&, T&) {}  // non-tensor outputs pass through
}  // namespace detail

// A module held for FSDP: call it like the module; `->` reaches the module itself.
template <typename Holder>
class Unit {
 public:
  Unit() = default;
  Unit(std::nullptr_t) {}                              // NOLINT: mirrors ModuleHolder
  Unit(Holder holder) : holder_(std::move(holder)) {}  // NOLINT: implicit, like a holder
  // From register_module's result, so `units.push_back(register_module("b", Block(...)))`.
  Unit(std::shared_ptr<typename Holder::ContainedType> impl)  // NOLINT: implicit
      : holder_(std::move(impl)) {}

  auto* operator->() { return holder_.get(); }
  const auto* operator->() const { return holder_.get(); }
  Holder& module() { return holder_; }
  // This rank's parameter shards, each tensor once (unique_parameters): give these to the
  // optimizer.
  std::vector<at::Tensor> parameters() const { return unique_parameters(*holder_); }
  const Holder& module() const { return holder_; }
  bool is_sharded() const { return detail::find_unit_state(holder_.get()) != nullptr; }

  template <typename... Args>
  auto operator()(Args&&... args) {
    using Out = decltype(holder_->forward(std::forward<Args>(args)...));
    auto state = detail::find_unit_state(holder_.get());
    if (!state) return holder_->forward(std::forward<Args>(args)...);
    const bool checkpoint = detail::checkpoints_forward(*state);
    if constexpr (!detail::TensorOutputs<Out>::value) {
      if (checkpoint) throw_not_checkpointable(typeid(Out).name());
    }
    detail::pre_forward(*state);
    Out out = checkpoint ? checkpointed_forward<Out>(*state, std::forward<Args>(args)...)
                         : holder_->forward(detail::cast_arg(*state, std::forward<Args>(args))...);
    detail::visit_outputs(*state, out);
    detail::post_forward(*state);
    return out;
  }

  // FSDP2's set_requires_gradient_sync. Off: the backwards that follow keep their gradients
  // unsharded on every rank (full size, in the reduce dtype) instead of reduce-scattering
  // them; the first backward with sync on again reduces everything accumulated, once. For
  // gradient accumulation: off for all micro-batches but the last. `recurse` applies it to
  // every unit inside as well. Throws InvalidArgument, changing nothing, while a backward of
  // this unit's tree is running.
  void set_requires_gradient_sync(bool sync, bool recurse = true) {
    detail::set_requires_gradient_sync(*required_state(), sync, recurse);
  }

  // Gathers this unit's full parameters now (blocking), as FSDP2's FSDPModule.unshard(); they
  // stay until reshard() (or the end of the next backward).
  void unshard() { detail::unshard(*required_state()); }
  void reshard() { detail::reshard(*required_state()); }
  // This rank's accounting for the unit and every unit inside it.
  MemoryStats memory_stats() const { return detail::memory_stats(*required_state()); }
  // This rank's communication time for the tree the unit belongs to.
  CommStats comm_stats() const { return detail::comm_stats(*required_state()); }

 private:
  std::shared_ptr<detail::UnitState> required_state() const;

  // The forward through detail::run_checkpointed: tensor arguments become the recompute's
  // inputs, others are kept by value for it.
  template <typename Out, typename... Args>
  Out checkpointed_forward(detail::UnitState& state, Args&&... args) {
    if constexpr (detail::TensorOutputs<Out>::value) {
      using Stored = std::tuple<std::decay_t<Args>...>;
      auto stored = std::make_shared<Stored>(detail::cast_arg(state, std::forward<Args>(args))...);
      std::vector<at::Tensor> inputs;
      detail::take_tensors(*stored, inputs);
      auto forward = [impl = holder_.ptr(), stored](const std::vector<at::Tensor>& tensors) {
        Stored call = *stored;
        detail::put_tensors(call, tensors);
        return detail::flatten_outputs(
            std::apply([&](auto&... a) { return impl->forward(a...); }, call));
      };
      return detail::unflatten_outputs<Out>(detail::run_checkpointed(state, inputs, forward));
    } else {
      throw_not_checkpointable(typeid(Out).name());
    }
  }

  Holder holder_{nullptr};
};

// Shards `holder`'s parameters over `pg` (see the file comment) and returns it as a Unit.
// The module keeps its FSDP state in a parameterless child module named "fsdp_state", so the
// state lives as long as the module does.
// Throws InvalidArgument, before touching any parameter, when: the module was already sharded,
// a child unit is sharded after its parent, its parameters mix dtypes, one is a scalar, a
// parameter is not on pg's device type or not floating. A unit left with no parameters of its
// own (all inside child units) is fine: it only coordinates.
template <typename Holder>
Unit<Holder> fully_shard(Holder holder, ProcessGroupPtr pg, FullyShardOptions options = {}) {
  detail::create_unit_state(holder.ptr(), std::move(pg), nullptr, std::move(options));
  return Unit<Holder>(std::move(holder));
}

// Hybrid sharding (HSDP): shards over mesh.shard; after each reduce-scatter of the gradients
// within the shard group, the reduced shard is all-reduced across mesh.replicate, so that every
// gradient is the average over the whole world (device_mesh.h). With one replica this is the
// overload above on mesh.shard.
template <typename Holder>
Unit<Holder> fully_shard(Holder holder, const DeviceMesh& mesh, FullyShardOptions options = {}) {
  detail::create_unit_state(holder.ptr(), mesh.shard, mesh.replicate, std::move(options));
  return Unit<Holder>(std::move(holder));
}

// The same for a module the model already holds as a Unit: `fully_shard(model->layers[i], pg)`.
template <typename Holder>
Unit<Holder> fully_shard(Unit<Holder>& unit, ProcessGroupPtr pg, FullyShardOptions options = {}) {
  return fully_shard(unit.module(), std::move(pg), std::move(options));
}
template <typename Holder>
Unit<Holder> fully_shard(Unit<Holder>& unit, const DeviceMesh& mesh,
                         FullyShardOptions options = {}) {
  return fully_shard(unit.module(), mesh, std::move(options));
}

template <typename Holder>
std::shared_ptr<detail::UnitState> Unit<Holder>::required_state() const {
  auto state = detail::find_unit_state(holder_.get());
  if (!state) throw_not_sharded("Unit::unshard/reshard/memory_stats/comm_stats");
  return state;
}

}  // namespace fsdp
