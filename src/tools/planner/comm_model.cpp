// CommModel (planner.h): link bandwidths, or collectives_bench's measured table.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "fsdp/tools/planner.h"
#include "util/check.h"

namespace fsdp::plan {

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kAllReduce:
      return "all_reduce";
  }
  return "?";
}

namespace {

Op parse_op(const std::string& s, const std::string& where) {
  for (Op op : {Op::kAllGather, Op::kReduceScatter, Op::kAllReduce}) {
    if (s == op_name(op)) return op;
  }
  throw PlanError(
      fmt::format("{}: unknown collective '{}' (expected all_gather, reduce_scatter "
                  "or all_reduce)",
                  where, s));
}

// The bytes each rank sends in a ring for a full buffer of `bytes` (all-reduce: twice).
double ring_factor(Op op, int ranks) {
  const double f = ranks > 1 ? static_cast<double>(ranks - 1) / ranks : 0.0;
  return op == Op::kAllReduce ? 2 * f : f;
}

}  // namespace

CommModel CommModel::links(double intra_busbw, double inter_busbw, double latency_s) {
  FSDP_CHECK_ARG(intra_busbw > 0 && inter_busbw > 0 && latency_s >= 0,
                 "CommModel::links: bandwidths must be positive and the latency >= 0, got {} "
                 "and {} bytes/s, {} s",
                 intra_busbw, inter_busbw, latency_s);
  CommModel m;
  m.intra_ = intra_busbw;
  m.inter_ = inter_busbw;
  m.latency_ = latency_s;
  return m;
}

CommModel CommModel::measured(const std::string& csv_path) {
  std::ifstream in(csv_path);
  if (!in) throw PlanError(fmt::format("cannot read the collectives table {}", csv_path));
  CommModel m;
  m.table_ = true;
  m.path_ = csv_path;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.empty() || line.rfind("op,", 0) == 0 || line[0] == '#') continue;
    std::stringstream ss(line);
    std::string op, ranks, bytes, seconds;
    const std::string where = fmt::format("{}:{}", csv_path, number);
    if (!std::getline(ss, op, ',') || !std::getline(ss, ranks, ',') ||
        !std::getline(ss, bytes, ',') || !std::getline(ss, seconds, ',')) {
      throw PlanError(fmt::format("{}: expected op,ranks,bytes,seconds, got '{}'", where, line));
    }
    try {
      const int n = std::stoi(ranks);
      const int64_t b = std::stoll(bytes);
      const double s = std::stod(seconds);
      if (n < 1 || b <= 0 || !(s > 0)) throw std::invalid_argument("range");
      m.rows_[{static_cast<int>(parse_op(op, where)), n}].emplace_back(b, s);
    } catch (const PlanError&) {
      throw;
    } catch (const std::exception&) {
      throw PlanError(fmt::format("{}: expected positive numbers in '{}'", where, line));
    }
  }
  for (auto& [key, rows] : m.rows_) std::sort(rows.begin(), rows.end());
  if (m.rows_.empty()) throw PlanError(fmt::format("{} holds no measurements", csv_path));
  return m;
}

double CommModel::seconds(Op op, int ranks, int64_t bytes, bool crosses_hosts) const {
  if (bytes <= 0) return 0;
  if (!table_) {
    const double busbw = crosses_hosts ? inter_ : intra_;
    return latency_ + ring_factor(op, ranks) * static_cast<double>(bytes) / busbw;
  }
  auto it = rows_.find({static_cast<int>(op), ranks});
  if (it == rows_.end()) {
    throw PlanError(
        fmt::format("{} has no {} over {} ranks; run collectives_bench at world {} "
                    "and add its table",
                    path_, op_name(op), ranks, ranks));
  }
  const auto& rows = it->second;
  if (bytes <= rows.front().first) return rows.front().second;  // latency-bound below
  if (bytes >= rows.back().first) {                             // bandwidth-bound above
    return rows.back().second * static_cast<double>(bytes) / rows.back().first;
  }
  auto hi = std::lower_bound(rows.begin(), rows.end(), std::make_pair(bytes, 0.0));
  auto lo = hi - 1;
  // Log-log between the neighbouring sizes: time is a power of size between them.
  const double t = std::log(static_cast<double>(bytes) / lo->first) /
                   std::log(static_cast<double>(hi->first) / lo->first);
  return std::exp(std::log(lo->second) + t * (std::log(hi->second) - std::log(lo->second)));
}

std::string CommModel::describe() const {
  if (table_) return fmt::format("measured times from {}", path_);
  return fmt::format(
      "bus bandwidth {:.0f} GB/s within a host, {:.0f} GB/s between hosts, {:.0f} us "
      "per collective",
      intra_ / 1e9, inter_ / 1e9, latency_ * 1e6);
}

}  // namespace fsdp::plan
