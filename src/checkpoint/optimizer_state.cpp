#include "checkpoint/optimizer_state.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::detail {

std::string optimizer_kind(const torch::optim::Optimizer* optimizer) {
  if (!optimizer) return "none";
  if (dynamic_cast<const torch::optim::AdamW*>(optimizer)) return "adamw";
  if (dynamic_cast<const torch::optim::SGD*>(optimizer)) return "sgd";
  throw CheckpointError(
      fmt::format("checkpoints hold the state of torch::optim::AdamW (fsdp::FusedAdamW too) and "
                  "torch::optim::SGD; this optimizer is {}",
                  c10::demangle(typeid(*optimizer).name())));
}

const std::vector<std::string>& state_names(const std::string& kind) {
  static const std::vector<std::string> adamw = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  static const std::vector<std::string> sgd = {"momentum_buffer"};
  static const std::vector<std::string> none;
  return kind == "adamw" ? adamw : kind == "sgd" ? sgd : none;
}

std::optional<ParamState> param_state(const torch::optim::Optimizer& optimizer,
                                      const std::string& kind, const at::Tensor& param) {
  const auto& all = optimizer.state();
  auto it = all.find(param.unsafeGetTensorImpl());
  if (it == all.end() || !it->second) return std::nullopt;
  ParamState out;
  auto put = [&](const char* name, const at::Tensor& t) {
    if (t.defined()) out.tensors[name] = t;
  };
  if (kind == "adamw") {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    out.step = s.step();
    put("exp_avg", s.exp_avg());
    put("exp_avg_sq", s.exp_avg_sq());
    put("max_exp_avg_sq", s.max_exp_avg_sq());
  } else if (kind == "sgd") {
    const auto& s = static_cast<const torch::optim::SGDParamState&>(*it->second);
    put("momentum_buffer", s.momentum_buffer());
  }
  return out;
}

void set_param_state(torch::optim::Optimizer& optimizer, const std::string& kind,
                     const at::Tensor& param, const std::optional<ParamState>& state) {
  auto& all = optimizer.state();
  void* key = param.unsafeGetTensorImpl();
  if (!state) {
    all.erase(key);
    return;
  }
  auto get = [&](const char* name) {
    auto it = state->tensors.find(name);
    return it == state->tensors.end() ? at::Tensor() : it->second;
  };
  if (kind == "adamw") {
    auto s = std::make_unique<torch::optim::AdamWParamState>();
    s->step(state->step);
    s->exp_avg(get("exp_avg"));
    s->exp_avg_sq(get("exp_avg_sq"));
    s->max_exp_avg_sq(get("max_exp_avg_sq"));
    all[key] = std::move(s);
  } else if (kind == "sgd") {
    auto s = std::make_unique<torch::optim::SGDParamState>();
    s->momentum_buffer(get("momentum_buffer"));
    all[key] = std::move(s);
  }
}

}  // namespace fsdp::detail
