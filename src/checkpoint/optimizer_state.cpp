#include "checkpoint/optimizer_state.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp::detail {
namespace {

using torch::optim::AdagradParamState;
using torch::optim::AdamParamState;
using torch::optim::AdamWParamState;
using torch::optim::RMSpropParamState;
using torch::optim::SGDParamState;

void put(ParamState& out, const char* name, const at::Tensor& t) {
  if (t.defined()) out.tensors[name] = t;
}

at::Tensor get(const ParamState& s, const char* name) {
  auto it = s.tensors.find(name);
  return it == s.tensors.end() ? at::Tensor() : it->second;
}

int64_t scalar(const ParamState& s, const char* name) {
  auto it = s.scalars.find(name);
  return it == s.scalars.end() ? 0 : it->second;
}

// Adam and AdamW keep the same fields under two unrelated types.
template <typename State>
ParamState read_adam(const State& s) {
  ParamState out;
  out.scalars["step"] = s.step();
  put(out, "exp_avg", s.exp_avg());
  put(out, "exp_avg_sq", s.exp_avg_sq());
  put(out, "max_exp_avg_sq", s.max_exp_avg_sq());
  return out;
}

template <typename State>
std::unique_ptr<State> make_adam(const ParamState& s) {
  auto out = std::make_unique<State>();
  out->step(scalar(s, "step"));
  out->exp_avg(get(s, "exp_avg"));
  out->exp_avg_sq(get(s, "exp_avg_sq"));
  out->max_exp_avg_sq(get(s, "max_exp_avg_sq"));
  return out;
}

// The fields each kind stores, so that an unknown one is refused by name.
const std::vector<std::string>& fields(const std::string& kind) {
  static const std::map<std::string, std::vector<std::string>> all = {
      {"adam", {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {"adamw", {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}},
      {"sgd", {"momentum_buffer"}},
      {"rmsprop", {"step", "square_avg", "momentum_buffer", "grad_avg"}},
      {"adagrad", {"step", "sum"}},
  };
  return all.at(kind);
}

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  const auto* o = &optimizer;
  if (dynamic_cast<const torch::optim::AdamW*>(o)) return "adamw";
  if (dynamic_cast<const torch::optim::Adam*>(o)) return "adam";
  if (dynamic_cast<const torch::optim::SGD*>(o)) return "sgd";
  if (dynamic_cast<const torch::optim::RMSprop*>(o)) return "rmsprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(o)) return "adagrad";
  throw InvalidArgument(fmt::format(
      "optimizer state: {} is not one whose state can be sharded: expected torch::optim::Adam, "
      "AdamW (fsdp::FusedAdamW too), SGD, RMSprop or Adagrad (LBFGS keeps one state for all "
      "parameters at once, which cannot be split by rows)",
      c10::demangle(typeid(optimizer).name())));
}

std::optional<ParamState> read_param_state(const torch::optim::Optimizer& optimizer,
                                           const std::string& kind, const at::Tensor& param) {
  const auto& all = optimizer.state();
  auto it = all.find(param.unsafeGetTensorImpl());
  if (it == all.end() || !it->second) return std::nullopt;
  const auto& state = *it->second;
  if (kind == "adamw") return read_adam(static_cast<const AdamWParamState&>(state));
  if (kind == "adam") return read_adam(static_cast<const AdamParamState&>(state));
  ParamState out;
  if (kind == "sgd") {
    put(out, "momentum_buffer", static_cast<const SGDParamState&>(state).momentum_buffer());
  } else if (kind == "rmsprop") {
    const auto& s = static_cast<const RMSpropParamState&>(state);
    out.scalars["step"] = s.step();
    put(out, "square_avg", s.square_avg());
    put(out, "momentum_buffer", s.momentum_buffer());
    put(out, "grad_avg", s.grad_avg());
  } else if (kind == "adagrad") {
    const auto& s = static_cast<const AdagradParamState&>(state);
    out.scalars["step"] = s.step();
    put(out, "sum", s.sum());
  }
  return out;
}

void write_param_state(torch::optim::Optimizer& optimizer, const std::string& kind,
                       const at::Tensor& param, const std::optional<ParamState>& state) {
  auto& all = optimizer.state();
  void* key = param.unsafeGetTensorImpl();
  if (!state) {
    all.erase(key);
    return;
  }
  const auto& known = fields(kind);
  auto check = [&](const std::string& name) {
    FSDP_CHECK_ARG(std::find(known.begin(), known.end(), name) != known.end(),
                   "optimizer state: '{}' is not a field of the {} optimizer's state (it has {})",
                   name, kind, fmt::join(known, ", "));
  };
  for (const auto& [name, t] : state->tensors) check(name);
  for (const auto& [name, v] : state->scalars) check(name);
  if (kind == "adamw") {
    all[key] = make_adam<AdamWParamState>(*state);
  } else if (kind == "adam") {
    all[key] = make_adam<AdamParamState>(*state);
  } else if (kind == "sgd") {
    auto s = std::make_unique<SGDParamState>();
    s->momentum_buffer(get(*state, "momentum_buffer"));
    all[key] = std::move(s);
  } else if (kind == "rmsprop") {
    auto s = std::make_unique<RMSpropParamState>();
    s->step(scalar(*state, "step"));
    s->square_avg(get(*state, "square_avg"));
    s->momentum_buffer(get(*state, "momentum_buffer"));
    s->grad_avg(get(*state, "grad_avg"));
    all[key] = std::move(s);
  } else if (kind == "adagrad") {
    auto s = std::make_unique<AdagradParamState>();
    s->step(scalar(*state, "step"));
    s->sum(get(*state, "sum"));
    all[key] = std::move(s);
  }
}

at::Tensor group_options_bytes(const torch::optim::OptimizerParamGroup& group) {
  torch::serialize::OutputArchive archive;
  group.options().serialize(archive);
  std::ostringstream out;
  archive.save_to(out);
  const std::string bytes = out.str();
  auto t = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  return t;
}

void restore_group_options(torch::optim::OptimizerParamGroup& group, const at::Tensor& bytes) {
  auto b = bytes.to(at::kCPU).contiguous();
  std::istringstream in(std::string(reinterpret_cast<const char*>(b.data_ptr<uint8_t>()),
                                    static_cast<size_t>(b.numel())));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  group.options().serialize(archive);
}

}  // namespace fsdp::detail
