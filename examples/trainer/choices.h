// The trainers' choice flags as enums: each flag's words map to a value once, at parsing
// (add_choice in choice_flag.h: any other word is refused, naming the accepted ones), and
// name() gives the word back for reports and messages.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/ops/float8_scaling.h"

namespace trainer {

// --dtype, --export-dtype: fp32, or bf16 (bf16 compute, fp32 reduction and master shards).
enum class Dtype { fp32, bf16 };
// --optimizer: fsdp::FusedAdamW, or libtorch's torch::optim::AdamW.
enum class OptimizerKind { fused_adamw, adamw };
// --lr-schedule after the warmup.
enum class LrSchedule { constant, cosine };
// --nonfinite: what a step with a NaN or infinite loss or gradient norm does.
enum class Nonfinite { stop, skip, off };
// --offload: none; optimizer (AdamW's moments on the host); all (FSDP2's CPUOffloadPolicy).
enum class Offload { none, optimizer, all };

// --float8-recipe: torchao's recipe names (fsdp/ops/float8_scaling.h).
using fsdp::ops::Float8Scaling;

// The words of each choice, in --help's order.
template <class E>
const std::vector<std::pair<std::string, E>>& choice_words();

template <>
inline const std::vector<std::pair<std::string, Dtype>>& choice_words<Dtype>() {
  static const std::vector<std::pair<std::string, Dtype>> w = {{"fp32", Dtype::fp32},
                                                               {"bf16", Dtype::bf16}};
  return w;
}
template <>
inline const std::vector<std::pair<std::string, OptimizerKind>>& choice_words<OptimizerKind>() {
  static const std::vector<std::pair<std::string, OptimizerKind>> w = {
      {"fused-adamw", OptimizerKind::fused_adamw}, {"adamw", OptimizerKind::adamw}};
  return w;
}
template <>
inline const std::vector<std::pair<std::string, LrSchedule>>& choice_words<LrSchedule>() {
  static const std::vector<std::pair<std::string, LrSchedule>> w = {
      {"constant", LrSchedule::constant}, {"cosine", LrSchedule::cosine}};
  return w;
}
template <>
inline const std::vector<std::pair<std::string, Nonfinite>>& choice_words<Nonfinite>() {
  static const std::vector<std::pair<std::string, Nonfinite>> w = {
      {"stop", Nonfinite::stop}, {"skip", Nonfinite::skip}, {"off", Nonfinite::off}};
  return w;
}
template <>
inline const std::vector<std::pair<std::string, Offload>>& choice_words<Offload>() {
  static const std::vector<std::pair<std::string, Offload>> w = {
      {"none", Offload::none}, {"optimizer", Offload::optimizer}, {"all", Offload::all}};
  return w;
}

template <>
inline const std::vector<std::pair<std::string, Float8Scaling>>& choice_words<Float8Scaling>() {
  static const std::vector<std::pair<std::string, Float8Scaling>> w = {
      {"tensorwise", Float8Scaling::tensorwise}, {"rowwise", Float8Scaling::rowwise}};
  return w;
}

// The word of `value` ("bf16").
template <class E>
std::string name(E value) {
  for (const auto& [word, v] : choice_words<E>()) {
    if (v == value) return word;
  }
  return "?";
}

}  // namespace trainer
