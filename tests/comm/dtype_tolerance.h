// Tolerance of collective results per dtype, shared by the collective tests and the stress
// program: the test values are quarters whose sums are exact in float32 and float64 and
// within one rounding step in 16-bit floats; integers must match exactly.
#pragma once

#include <ATen/ATen.h>

namespace fsdp::testing {

inline double collective_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return 1e-2;
    case at::kHalf:
      return 1e-3;
    case at::kFloat:
      return 1e-6;
    case at::kDouble:
      return 1e-12;
    default:
      return 0.0;
  }
}

}  // namespace fsdp::testing
