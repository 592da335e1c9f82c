#include "fsdp/tools/profiler.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unordered_map>
#include <utility>

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

// The length of the union of `spans` (sorted here by start).
uint64_t covered_ns(std::vector<std::pair<uint64_t, uint64_t>>& spans) {
  std::sort(spans.begin(), spans.end());
  uint64_t covered = 0, reach = 0;
  for (const auto& [start, end] : spans) {
    if (end <= reach) continue;
    covered += end - std::max(start, reach);
    reach = end;
  }
  return covered;
}

// The part of the union of `a` that no span of `b` covers (both sorted by start, as
// covered_ns leaves them).
uint64_t uncovered_ns(const std::vector<std::pair<uint64_t, uint64_t>>& a,
                      const std::vector<std::pair<uint64_t, uint64_t>>& b) {
  // Merge b into disjoint intervals, then walk a's union against them.
  std::vector<std::pair<uint64_t, uint64_t>> merged;
  for (const auto& s : b) {
    if (!merged.empty() && s.first <= merged.back().second) {
      merged.back().second = std::max(merged.back().second, s.second);
    } else {
      merged.push_back(s);
    }
  }
  uint64_t out = 0, reach = 0;
  size_t j = 0;
  for (auto [start, end] : a) {
    start = std::max(start, reach);
    if (end <= start) continue;
    reach = end;
    while (j < merged.size() && merged[j].second <= start) ++j;
    uint64_t at = start;
    for (size_t k = j; k < merged.size() && merged[k].first < end; ++k) {
      if (merged[k].first > at) out += merged[k].first - at;
      at = std::max(at, merged[k].second);
      if (at >= end) break;
    }
    if (at < end) out += end - at;
  }
  return out;
}

// "fsdp::all_gather_wait (layers.0)" -> {"fsdp::all_gather_wait", "layers.0"}.
std::pair<std::string, std::string> split_unit(const std::string& name) {
  const auto open = name.find(" (");
  if (open == std::string::npos || name.back() != ')') return {name, ""};
  return {name.substr(0, open), name.substr(open + 2, name.size() - open - 3)};
}

// Opens `path` for writing as the trace will be, so that a path that cannot be written is
// named with the system's reason: kineto's save() reports nothing when it cannot write.
void check_writable(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw IoError(fmt::format("stop_profiling: cannot write the trace to {}: {}", path,
                              std::strerror(errno)));
  }
  ::close(fd);
}

// Whether the file ends as a JSON document does (its last character other than white space is
// '}' or ']'): kineto's save() leaves an empty or cut-off file where a write failed, and says
// nothing.
bool ends_as_json(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char tail[64];
  const off_t size = ::lseek(fd, 0, SEEK_END);
  const off_t from = std::max<off_t>(0, size - static_cast<off_t>(sizeof(tail)));
  const ssize_t n = size > 0 ? ::pread(fd, tail, sizeof(tail), from) : 0;
  ::close(fd);
  for (ssize_t i = n - 1; i >= 0; --i) {
    if (tail[i] == ' ' || tail[i] == '\n' || tail[i] == '\r' || tail[i] == '\t') continue;
    return tail[i] == '}' || tail[i] == ']';
  }
  return false;
}

}  // namespace

void start_profiling(const ProfileOptions& options) {
  if (torch::autograd::profiler::isProfilerEnabledInMainThread()) {
    throw Error("start_profiling: a profiler is already running");
  }
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (torch::cuda::is_available()) activities.insert(prof::ActivityType::CUDA);
  prof::ProfilerConfig config(prof::ProfilerState::KINETO,
                              /*report_input_shapes=*/options.record_shapes,
                              /*profile_memory=*/false, /*with_stack=*/false,
                              /*with_flops=*/options.record_shapes);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
}

ProfilingScope::ProfilingScope(const ProfileOptions& options) { start_profiling(options); }

ProfilingScope::~ProfilingScope() {
  if (!running_) return;
  try {
    (void)torch::autograd::profiler::disableProfiler();
  } catch (...) {
    // A destructor, maybe during an error's unwinding: the profiler is off either way.
  }
}

ProfileSummary ProfilingScope::stop(const std::string& trace_path) {
  if (!running_) throw Error("ProfilingScope::stop: the profiler was already stopped");
  running_ = false;  // stop_profiling stops it even when it throws
  return stop_profiling(trace_path);
}

ProfileSummary stop_profiling(const std::string& trace_path) {
  auto result = torch::autograd::profiler::disableProfiler();
  if (!trace_path.empty()) {
    check_writable(trace_path);
    result->save(trace_path);
    if (!ends_as_json(trace_path)) {
      throw IoError(fmt::format("stop_profiling: the trace {} was not written whole (a full disk?)",
                                trace_path));
    }
  }
  ProfileSummary out;
  std::unordered_map<uint64_t, std::vector<Span>> by_thread;
  std::unordered_map<std::string, OpStats> device_by_name;
  // Device activity: NCCL's kernels, and everything else (compute kernels, copies).
  std::vector<std::pair<uint64_t, uint64_t>> nccl_spans, other_spans;
  uint64_t first = UINT64_MAX, last = 0;
  for (const auto& e : result->events()) {
    if (e.endNs() < e.startNs()) continue;
    if (e.deviceType() != c10::DeviceType::CPU) {
      // A kernel or copy on a device: its time is device time, not nested like CPU ranges.
      auto& st = device_by_name[e.name()];
      st.name = e.name();
      st.calls += 1;
      st.self_ms += (e.endNs() - e.startNs()) / 1e6;
      st.total_ms = st.self_ms;
      (starts_with(e.name(), "nccl") ? nccl_spans : other_spans)
          .emplace_back(e.startNs(), e.endNs());
      continue;
    }
    Span s{e.name(), e.startNs(), e.endNs()};
    first = std::min(first, s.start);
    last = std::max(last, s.end);
    if (starts_with(s.name, "fsdp::")) {
      // Operators are tallied by the range's bare name; the unit goes to the wait tables.
      auto [base, unit] = split_unit(s.name);
      s.name = base;
      out.fsdp_counts[base] += 1;
      const double ms = (s.end - s.start) / 1e6;
      if (starts_with(base, "fsdp::comm::")) out.comm_ms += ms;
      if (ends_with(base, "_wait")) out.exposed_comm_ms += ms;
      if (base == "fsdp::all_gather_wait") out.all_gather_wait_ms[unit] += ms;
      // The gradient reduction: the reduce-scatter, and with hybrid sharding the all-reduce.
      if (base == "fsdp::reduce_scatter_wait" || base == "fsdp::all_reduce_wait") {
        out.reduce_scatter_wait_ms[unit] += ms;
      }
    }
    by_thread[e.startThreadId()].push_back(std::move(s));
  }
  std::unordered_map<std::string, OpStats> by_name;
  // The training threads: those running FSDP's forward/backward phases. On CPU that is the
  // thread that called backward(); on CUDA the forward runs there but the backward on
  // autograd's device thread, so both count.
  std::vector<std::pair<uint64_t, uint64_t>> training_spans;
  for (auto& [tid, spans] : by_thread) {
    add_thread(spans, by_name);  // sorts the spans by start
    const bool training = std::any_of(spans.begin(), spans.end(), [](const Span& s) {
      return starts_with(s.name, "fsdp::pre_") || starts_with(s.name, "fsdp::post_");
    });
    if (!training) continue;
    for (const auto& s : spans) training_spans.emplace_back(s.start, s.end);
  }
  if (!nccl_spans.empty()) {
    // On a GPU the host's waits take microseconds (wait() only queues a stream wait): what is
    // exposed is the time NCCL's kernels run while no other kernel does.
    out.comm_ms = covered_ns(nccl_spans) / 1e6;
    out.compute_ms = covered_ns(other_spans) / 1e6;
    out.exposed_comm_ms = uncovered_ns(nccl_spans, other_spans) / 1e6;
    out.device_figures = true;
  } else {
    // Compute: the time the training threads spent inside operators (the union of their
    // spans), less the time they waited for collectives.
    out.compute_ms = std::max(0.0, covered_ns(training_spans) / 1e6 - out.exposed_comm_ms);
  }
  out.threads = static_cast<int64_t>(by_thread.size());
  out.span_ms = last > first ? (last - first) / 1e6 : 0;
  out.overlap = out.comm_ms > 0 ? std::max(0.0, 1 - out.exposed_comm_ms / out.comm_ms) : 0;
  for (auto& [name, st] : by_name) out.ops.push_back(std::move(st));
  for (auto& [name, st] : device_by_name) out.device_ops.push_back(std::move(st));
  for (auto* list : {&out.ops, &out.device_ops}) {
    std::sort(list->begin(), list->end(),
              [](const OpStats& a, const OpStats& b) { return a.self_ms > b.self_ms; });
  }
  return out;
}

std::string format_op_table(const ProfileSummary& summary, int top) {
  auto table = [top](const std::vector<OpStats>& ops, const char* what, const char* self,
                     const char* total) {
    double all_self = 0;
    for (const auto& op : ops) all_self += op.self_ms;
    std::string out =
        fmt::format("{:<44} {:>7} {:>11} {:>11} {:>7}\n", what, "calls", self, total, "self %");
    for (int i = 0; i < top && i < static_cast<int>(ops.size()); ++i) {
      const auto& op = ops[i];
      out += fmt::format("{:<44} {:>7} {:>11.2f} {:>11.2f} {:>6.1f}%\n",
                         op.name.size() > 44 ? op.name.substr(0, 41) + "..." : op.name, op.calls,
                         op.self_ms, op.total_ms, all_self > 0 ? 100 * op.self_ms / all_self : 0);
    }
    return out;
  };
  std::string out = table(summary.ops, "operator", "self ms", "total ms");
  if (!summary.device_ops.empty()) {
    out += table(summary.device_ops, "device kernel", "device ms", "device ms");
  }
  return out;
}

std::string format_unit_waits(const ProfileSummary& summary) {
  std::vector<std::string> units;
  for (const auto& [unit, ms] : summary.all_gather_wait_ms) units.push_back(unit);
  for (const auto& [unit, ms] : summary.reduce_scatter_wait_ms) {
    if (!summary.all_gather_wait_ms.count(unit)) units.push_back(unit);
  }
  auto ms_of = [](const std::map<std::string, double>& m, const std::string& unit) {
    auto it = m.find(unit);
    return it == m.end() ? 0.0 : it->second;
  };
  std::stable_sort(units.begin(), units.end(), [&](const std::string& a, const std::string& b) {
    return ms_of(summary.all_gather_wait_ms, a) > ms_of(summary.all_gather_wait_ms, b);
  });
  std::string out =
      fmt::format("{:<32} {:>18} {:>22}\n", "unit", "all-gather wait ms", "reduce-scatter wait ms");
  for (const auto& unit : units) {
    out += fmt::format("{:<32} {:>18.2f} {:>22.2f}\n", unit.empty() ? "(unnamed)" : unit,
                       ms_of(summary.all_gather_wait_ms, unit),
                       ms_of(summary.reduce_scatter_wait_ms, unit));
  }
  return out;
}

}  // namespace fsdp
