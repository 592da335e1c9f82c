// Internal: FSDP_RANGE(name) names the enclosing scope as a range in libtorch's profiler
// (Chrome/Perfetto traces; include/fsdp/tools/profiler.h lists the names) and, in builds with the
// CUDA toolkit's NVTX headers, as an NVTX range for Nsight Systems and `ncu --nvtx`.
// FSDP_RANGE_BYTES(name, bytes) also records `bytes` as the range's input, which a trace shows
// as its "Concrete Inputs" when shapes are recorded (the collectives' sizes).
//
// With no profiler running a range costs a check of libtorch's callback flags (and, with
// NVTX, a call through NVTX's empty stub when no tool is attached); names are copied only
// when recording, so a name may be a temporary std::string.
#pragma once

#include <ATen/record_function.h>

#include <cstdint>
#include <string>
#include <string_view>

#ifdef FSDP_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace fsdp::detail {

class ProfilerRange {
 public:
  explicit ProfilerRange(const char* name) : guard_(at::RecordScope::FUNCTION) {
    if (guard_.isActive()) guard_.before(std::string_view(name));
    push_nvtx(name);
  }
  explicit ProfilerRange(const std::string& name) : ProfilerRange(name.c_str()) {}
  ProfilerRange(const char* name, int64_t bytes)
      : bytes_(bytes), guard_(at::RecordScope::FUNCTION) {
    if (guard_.isActive()) {
      if (guard_.needsInputs()) {
        guard_.before(std::string_view(name), c10::ArrayRef<const c10::IValue>(&bytes_, 1));
      } else {
        guard_.before(std::string_view(name));
      }
    }
    push_nvtx(name);
  }
  ProfilerRange(const std::string& name, int64_t bytes) : ProfilerRange(name.c_str(), bytes) {}
  ~ProfilerRange() {
#ifdef FSDP_HAVE_NVTX
    nvtxRangePop();
#endif
  }
  ProfilerRange(const ProfilerRange&) = delete;
  ProfilerRange& operator=(const ProfilerRange&) = delete;

 private:
  static void push_nvtx([[maybe_unused]] const char* name) {
#ifdef FSDP_HAVE_NVTX
    nvtxRangePushA(name);
#endif
  }
  c10::IValue bytes_;  // outlives guard_, which refers to it as its input
  at::RecordFunction guard_;
};

// The per-unit range names, "fsdp::pre_forward (layers.0)" (FSDP2 names its ranges the same
// way), built once when the unit learns its name in the root; the bare names before that.
struct UnitRangeNames {
  std::string pre_forward = "fsdp::pre_forward", post_forward = "fsdp::post_forward",
              pre_backward = "fsdp::pre_backward", post_backward = "fsdp::post_backward",
              all_gather = "fsdp::all_gather", all_gather_wait = "fsdp::all_gather_wait",
              reduce_scatter = "fsdp::reduce_scatter",
              reduce_scatter_wait = "fsdp::reduce_scatter_wait", all_reduce = "fsdp::all_reduce",
              all_reduce_wait = "fsdp::all_reduce_wait";
  UnitRangeNames() = default;
  explicit UnitRangeNames(const std::string& unit) {
    for (std::string* n :
         {&pre_forward, &post_forward, &pre_backward, &post_backward, &all_gather, &all_gather_wait,
          &reduce_scatter, &reduce_scatter_wait, &all_reduce, &all_reduce_wait}) {
      *n += " (" + unit + ")";
    }
  }
};

}  // namespace fsdp::detail

#define FSDP_RANGE_CONCAT_INNER(a, b) a##b
#define FSDP_RANGE_CONCAT(a, b) FSDP_RANGE_CONCAT_INNER(a, b)
#define FSDP_RANGE(name) \
  ::fsdp::detail::ProfilerRange FSDP_RANGE_CONCAT(fsdp_range_, __LINE__)(name)
#define FSDP_RANGE_BYTES(name, bytes) \
  ::fsdp::detail::ProfilerRange FSDP_RANGE_CONCAT(fsdp_range_, __LINE__)(name, bytes)
