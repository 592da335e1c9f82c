// float8 in the Llama model (llama.h): which of the decoder's Linears float8 converts and whether
// it can (validate_float8), and their weights gathered in float8 (use_float8_all_gather).
#include <fmt/ranges.h>

#include <algorithm>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fsdp/errors.h"
#include "fsdp/models/llama.h"
#include "fsdp/ops/float8.h"
#include "fsdp/ops/float8_all_gather.h"
#include "model_check.h"

namespace fsdp::models::llama {

void validate_float8(const Config& c, const Float8Options& float8, int tp_size, bool lora) {
  if (!float8.enabled) {
    FSDP_MODEL_CHECK(float8.skip.empty(), "float8: Linears to skip ({}) but float8 is off",
                     fmt::join(float8.skip, ", "));
    FSDP_MODEL_CHECK(float8.scaling == ops::Float8Scaling::tensorwise,
                     "float8: rowwise scaling but float8 is off");
    return;
  }
  FSDP_MODEL_CHECK(tp_size == 1,
                   "float8: tensor parallelism (degree {}) is not supported with it: a split "
                   "weight's scale would be its shard's; use FSDP alone (--tp 1)",
                   tp_size);
  FSDP_MODEL_CHECK(!lora, "float8: LoRA adapters are not supported with it; train the full model");
  const int64_t d = c.hidden_size, i = c.intermediate_size;
  // Each Linear's inputs and outputs, as the layers build them.
  const std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> linears = {
      {"q_proj", {d, c.q_size()}}, {"k_proj", {d, c.kv_size()}}, {"v_proj", {d, c.kv_size()}},
      {"o_proj", {c.q_size(), d}}, {"gate_proj", {d, i}},        {"up_proj", {d, i}},
      {"down_proj", {i, d}}};
  std::vector<std::string> names;
  for (const auto& l : linears) names.push_back(l.first);
  for (const auto& s : float8.skip) {
    FSDP_MODEL_CHECK(std::find(names.begin(), names.end(), s) != names.end(),
                     "float8: '{}' to skip names no Linear of a decoder layer (expected some of "
                     "{})",
                     s, fmt::join(names, ", "));
  }
  for (const auto& [name, dims] : linears) {
    if (std::find(float8.skip.begin(), float8.skip.end(), name) != float8.skip.end()) continue;
    const auto why = ops::float8_linear_unsupported(dims.first, dims.second);
    FSDP_MODEL_CHECK(why.empty(), "float8: {} is {}; skip it or train without float8", name, why);
  }
}

void use_float8_all_gather(FSDPModule& unit) {
  FSDP_MODEL_CHECK(unit.is_sharded(), "use_float8_all_gather: the module is not sharded");
  // Each float8 Linear by its weight; weak: the hook lives in the module's own unit state.
  std::unordered_map<const c10::TensorImpl*, std::weak_ptr<LinearImpl>> linears;
  for (const auto& m : unit.nn_module()->modules(/*include_self=*/true)) {
    auto linear = std::dynamic_pointer_cast<LinearImpl>(m);
    if (!linear || !linear->float8()) continue;
    FSDP_MODEL_CHECK(linear->float8_scaling() == ops::Float8Scaling::tensorwise,
                     "use_float8_all_gather: a float8 all-gather casts each weight with one "
                     "scale (tensorwise); these Linears scale rowwise");
    linears[linear->weight.unsafeGetTensorImpl()] = linear;
  }
  FSDP_MODEL_CHECK(!linears.empty(), "use_float8_all_gather: the unit holds no float8 Linear");
  ops::Float8AllGatherOptions options;
  std::vector<std::weak_ptr<LinearImpl>> by_index;
  for (const auto& p : unit.parameters()) {
    auto it = linears.find(p.unsafeGetTensorImpl());
    options.float8.push_back(it != linears.end());
    by_index.push_back(it != linears.end() ? it->second : std::weak_ptr<LinearImpl>());
  }
  options.on_scale = [by_index](size_t i, const at::Tensor& scale) {
    if (auto linear = by_index[i].lock()) linear->set_float8_weight_scale(scale);
  };
  unit.set_custom_all_gather(ops::float8_all_gather(std::move(options)));
}

}  // namespace fsdp::models::llama
