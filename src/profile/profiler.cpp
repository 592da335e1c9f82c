#include "fsdp/profiler.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>

#include <algorithm>
#include <unordered_map>

#include "fsdp/errors.h"

namespace fsdp {
namespace {

namespace prof = torch::profiler::impl;

struct Span {
  std::string name;
  uint64_t start, end;
};

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Self time per span: its duration less that of the spans directly inside it (same thread,
// properly nested, as the profiler's ranges are).
void add_thread(std::vector<Span>& spans, std::unordered_map<std::string, OpStats>& by_name) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  std::vector<std::pair<const Span*, uint64_t>> stack;  // span, time in its children
  auto close = [&](const Span& s, uint64_t child_ns) {
    auto& st = by_name[s.name];
    st.name = s.name;
    st.calls += 1;
    st.total_ms += (s.end - s.start) / 1e6;
    st.self_ms += (s.end - s.start - std::min(child_ns, s.end - s.start)) / 1e6;
  };
  for (const auto& s : spans) {
    while (!stack.empty() && stack.back().first->end <= s.start) {
      close(*stack.back().first, stack.back().second);
      stack.pop_back();
    }
    if (!stack.empty()) stack.back().second += s.end - s.start;
    stack.emplace_back(&s, 0);
  }
  while (!stack.empty()) {
    close(*stack.back().first, stack.back().second);
    stack.pop_back();
  }
}

}  // namespace

void start_profiling() {
  if (torch::autograd::profiler::isProfilerEnabledInMainThread()) {
    throw Error("start_profiling: a profiler is already running");
  }
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (torch::cuda::is_available()) activities.insert(prof::ActivityType::CUDA);
  prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

ProfileSummary stop_profiling(const std::string& trace_path) {
  auto result = torch::autograd::profiler::disableProfiler();
  if (!trace_path.empty()) result->save(trace_path);
  ProfileSummary out;
  std::unordered_map<uint64_t, std::vector<Span>> by_thread;
  uint64_t first = UINT64_MAX, last = 0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CPU || e.endNs() < e.startNs()) continue;
    Span s{e.name(), e.startNs(), e.endNs()};
    first = std::min(first, s.start);
    last = std::max(last, s.end);
    if (starts_with(s.name, "fsdp::")) {
      out.fsdp_counts[s.name] += 1;
      const double ms = (s.end - s.start) / 1e6;
      if (starts_with(s.name, "fsdp::comm::")) out.comm_ms += ms;
      if (ends_with(s.name, "_wait")) out.exposed_comm_ms += ms;
    }
    by_thread[e.startThreadId()].push_back(std::move(s));
  }
  std::unordered_map<std::string, OpStats> by_name;
  for (auto& [tid, spans] : by_thread) add_thread(spans, by_name);
  out.threads = static_cast<int64_t>(by_thread.size());
  out.span_ms = last > first ? (last - first) / 1e6 : 0;
  out.overlap = out.comm_ms > 0 ? std::max(0.0, 1 - out.exposed_comm_ms / out.comm_ms) : 0;
  for (auto& [name, st] : by_name) out.ops.push_back(std::move(st));
  std::sort(out.ops.begin(), out.ops.end(),
            [](const OpStats& a, const OpStats& b) { return a.self_ms > b.self_ms; });
  return out;
}

std::string format_op_table(const ProfileSummary& summary, int top) {
  double all_self = 0;
  for (const auto& op : summary.ops) all_self += op.self_ms;
  std::string out = fmt::format("{:<44} {:>7} {:>11} {:>11} {:>7}\n", "operator", "calls",
                                "self ms", "total ms", "self %");
  for (int i = 0; i < top && i < static_cast<int>(summary.ops.size()); ++i) {
    const auto& op = summary.ops[i];
    out += fmt::format("{:<44} {:>7} {:>11.2f} {:>11.2f} {:>6.1f}%\n",
                       op.name.size() > 44 ? op.name.substr(0, 41) + "..." : op.name, op.calls,
                       op.self_ms, op.total_ms, all_self > 0 ? 100 * op.self_ms / all_self : 0);
  }
  return out;
}

}  // namespace fsdp
