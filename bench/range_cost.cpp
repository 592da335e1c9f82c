// The cost of FSDP's profiler ranges when no profiler runs: nanoseconds per FSDP_RANGE (with a
// fixed name, with a per-unit std::string name, and with a byte count), against an empty loop.
// bench/profiler_cost.sh multiplies it by the ranges per step to bound "profiling off".
//   build/bin/range_cost [--iterations 20000000]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <string>

#include "util/profiler_range.h"

namespace {

template <typename F>
double ns_per_call(int64_t n, F&& f) {
  double best = 1e300;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < n; ++i) f(i);
    const std::chrono::duration<double, std::nano> dt = std::chrono::steady_clock::now() - t0;
    best = std::min(best, dt.count() / n);
  }
  return best;
}

volatile int64_t sink = 0;  // keeps the loops from being optimised away

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 20'000'000;
  CLI::App app{"ns per FSDP profiler range with no profiler running"};
  app.add_option("--iterations", n)->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  const std::string unit_name = "fsdp::all_gather_wait (layers.0)";
  const double empty = ns_per_call(n, [](int64_t i) { sink = sink + i; });
  const double fixed = ns_per_call(n, [](int64_t i) {
    FSDP_RANGE("fsdp::all_gather_copy_in");
    sink = sink + i;
  });
  const double named = ns_per_call(n, [&](int64_t i) {
    FSDP_RANGE(unit_name);
    sink = sink + i;
  });
  const double bytes = ns_per_call(n, [](int64_t i) {
    FSDP_RANGE_BYTES("fsdp::comm::all_gather", i);
    sink = sink + i;
  });
  fmt::print(
      "range_cost: empty loop {:.2f} ns; fixed name {:.2f} ns; unit name {:.2f} ns; "
      "with bytes {:.2f} ns per range (no profiler)\n",
      empty, fixed - empty, named - empty, bytes - empty);
  fmt::print("range_cost_ns {:.3f}\n", std::max({fixed, named, bytes}) - empty);
}
