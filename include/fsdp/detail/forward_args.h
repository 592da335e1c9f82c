// Internal: how fsdp::Unit hands a forward's arguments and outputs to the runtime, which sees
// tensors only: tensor arguments become the forward's inputs (cast, wrapped for the backward,
// saved by a checkpointed unit for its recompute), other arguments are kept by value and given
// again; outputs are flattened to a list and rebuilt.
#pragma once

#include <ATen/ATen.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp::detail {

template <typename T>
inline constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;

// Outputs a checkpointed forward may return.
template <typename T>
struct TensorOutputs : std::false_type {};
template <>
struct TensorOutputs<at::Tensor> : std::true_type {};
template <>
struct TensorOutputs<std::vector<at::Tensor>> : std::true_type {};
template <typename... T>
struct TensorOutputs<std::tuple<T...>> : std::bool_constant<(kIsTensor<T> && ...)> {};

// Moves the tensor elements of `args` into `out` (leaving undefined tensors behind: the
// recompute gets them back from autograd's saved inputs).
template <typename Tuple>
void take_tensors(Tuple& args, std::vector<at::Tensor>& out) {
  std::apply(
      [&](auto&... a) {
        auto one = [&](auto& x) {
          if constexpr (kIsTensor<decltype(x)>) out.push_back(std::move(x));
        };
        (one(a), ...);
      },
      args);
}

// Puts `tensors` back, in order, into the tensor elements of `args`.
template <typename Tuple>
void put_tensors(Tuple& args, const std::vector<at::Tensor>& tensors) {
  size_t next = 0;
  std::apply(
      [&](auto&... a) {
        auto one = [&](auto& x) {
          if constexpr (kIsTensor<decltype(x)>) x = tensors.at(next++);
        };
        (one(a), ...);
      },
      args);
}

// Calls `f` on the arguments kept in `stored` with `tensors` in place of their tensor elements.
// A copy of `stored` when it can be copied, so that the call can run again (a recompute).
template <typename F, typename Tuple>
decltype(auto) apply_with_tensors(F& f, Tuple& stored, const std::vector<at::Tensor>& tensors) {
  if constexpr (std::is_copy_constructible_v<Tuple>) {
    Tuple call = stored;
    put_tensors(call, tensors);
    return std::apply(f, call);
  } else {
    put_tensors(stored, tensors);
    return std::apply(f, stored);
  }
}

inline std::vector<at::Tensor> flatten_outputs(at::Tensor t) { return {std::move(t)}; }
inline std::vector<at::Tensor> flatten_outputs(std::vector<at::Tensor> ts) { return ts; }
template <typename... T>
std::vector<at::Tensor> flatten_outputs(std::tuple<T...> t) {
  return std::apply([](auto&... x) { return std::vector<at::Tensor>{std::move(x)...}; }, t);
}

template <typename Tuple, size_t... I>
Tuple tuple_from(std::vector<at::Tensor>& list, std::index_sequence<I...>) {
  return Tuple{std::move(list.at(I))...};
}

template <typename Out>
Out unflatten_outputs(std::vector<at::Tensor> list) {
  if constexpr (std::is_same_v<Out, at::Tensor>) {
    return std::move(list.at(0));
  } else if constexpr (std::is_same_v<Out, std::vector<at::Tensor>>) {
    return list;
  } else {
    return tuple_from<Out>(list, std::make_index_sequence<std::tuple_size_v<Out>>{});
  }
}

}  // namespace fsdp::detail
