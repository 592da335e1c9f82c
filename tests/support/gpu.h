// GPU tests: they skip on a machine without a GPU, and fail there instead when
// FSDP_REQUIRE_GPU=1 (the GPU check sets it), so that a GPU run whose libtorch cannot reach the
// device (libtorch_cuda dropped by the linker, a driver older than the wheel needs) does not
// pass by skipping everything.
#pragma once

#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace fsdp::testing {

inline bool have_gpu() { return at::hasCUDA() && at::getNumGPUs() > 0; }

inline bool gpu_required() {
  const char* v = std::getenv("FSDP_REQUIRE_GPU");
  return v != nullptr && *v != '\0' && std::string(v) != "0";
}

inline const char* kNoGpu =
    "no CUDA device visible to libtorch (at::hasCUDA() is false or no GPU is visible)";

}  // namespace fsdp::testing

// In a test body or SetUp(): skips without a GPU, or fails under FSDP_REQUIRE_GPU=1.
#define FSDP_SKIP_WITHOUT_GPU()                                      \
  do {                                                               \
    if (!::fsdp::testing::have_gpu()) {                              \
      if (::fsdp::testing::gpu_required()) {                         \
        FAIL() << "FSDP_REQUIRE_GPU=1: " << ::fsdp::testing::kNoGpu; \
      }                                                              \
      GTEST_SKIP() << ::fsdp::testing::kNoGpu;                       \
    }                                                                \
  } while (0)
