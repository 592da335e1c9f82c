// How far one tensor is from another, for the tests' tolerances.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>

namespace fsdp::testing {

// max |a - b| / max |b|, in float64 on the host (a and b may be on different devices): the error
// relative to b's largest value, so that elements near 0 do not decide it.
inline double rel_diff(const at::Tensor& a, const at::Tensor& b) {
  const auto bd = b.to(at::kDouble).cpu();
  return (a.to(at::kDouble).cpu() - bd).abs().max().item<double>() /
         std::max(bd.abs().max().item<double>(), 1e-30);
}

}  // namespace fsdp::testing
