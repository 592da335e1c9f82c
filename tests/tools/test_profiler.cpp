// ProfilingScope and stop_profiling on the way out of an error: the profiler is stopped on
// every path (one left running crashes libtorch's teardown at exit), and a trace that cannot be
// written is an IoError naming it, not a silent loss.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"
#include "fsdp/tools/profiler.h"

namespace fsdp::testing {
namespace {

ProfileOptions fast() { return ProfileOptions{/*record_shapes=*/false}; }

// start_profiling throws while a profiler runs: a start that succeeds shows it was stopped.
void expect_stopped() {
  ASSERT_NO_THROW(start_profiling(fast())) << "the profiler was left running";
  stop_profiling("");
}

TEST(ProfilingScope, AnErrorLeavingTheScopeStopsTheProfiler) {
  try {
    ProfilingScope scope(fast());
    EXPECT_THROW(start_profiling(fast()), Error) << "a second profiler while one runs";
    throw std::runtime_error("a step failed");
  } catch (const std::runtime_error&) {
  }
  expect_stopped();
}

TEST(ProfilingScope, StopWritesTheTraceAndSummarises) {
  // fsdp::io, not std::filesystem: libtorch.so's copy of remove_all crashes (fsdp/io/files.h).
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir =
      std::string(tmp ? tmp : "/tmp") + "/fsdp_test_profiler_" + std::to_string(::getpid());
  io::make_directories(dir);
  const std::string path = dir + "/trace.json";
  ProfilingScope scope(fast());
  (void)(torch::ones({8, 8}).matmul(torch::ones({8, 8}))).sum().item<float>();
  const auto summary = scope.stop(path);
  EXPECT_FALSE(summary.ops.empty());
  EXPECT_GT(io::read_file(path).size(), 0u);
  EXPECT_THROW(scope.stop(path), Error) << "a second stop";
  io::remove_tree(dir);
  expect_stopped();
}

TEST(ProfilingScope, ATraceThatCannotBeWrittenIsNamedAndTheProfilerStops) {
  ProfilingScope scope(fast());
  try {
    scope.stop("/nonexistent-fsdp-dir/trace.json");
    FAIL() << "expected an IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "cannot write the trace to /nonexistent-fsdp-dir/trace.json: No such file"),
              std::string::npos)
        << e.what();
  }
  expect_stopped();
}

}  // namespace
}  // namespace fsdp::testing
