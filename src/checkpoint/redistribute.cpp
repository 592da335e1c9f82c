#include "checkpoint/redistribute.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "util/check.h"

namespace fsdp::detail {
namespace {

int64_t rows_of(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return t.dim() == 0 ? 1 : t.size(0);
}

int64_t row_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

// Whether [begin, end) is covered by the union of `ranges`.
bool covered(int64_t begin, int64_t end, std::vector<std::pair<int64_t, int64_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  int64_t reached = begin;
  for (const auto& [b, e] : ranges) {
    if (b > reached) break;
    reached = std::max(reached, e);
  }
  return reached >= end;
}

}  // namespace

void redistribute(std::vector<Move>& moves, ProcessGroup& world) {
  const int ranks = world.size();
  const int64_t n = static_cast<int64_t>(moves.size());
  // Per move: source offset, source rows, target offset, target rows; then a fingerprint of
  // the names and shapes, so that ranks passing different lists fail instead of mismatching.
  auto mine = at::zeros({4 * n + 1}, at::kLong);
  auto* m = mine.data_ptr<int64_t>();
  size_t fingerprint = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Move& mv = moves[i];
    m[4 * i] = mv.source_offset;
    m[4 * i + 1] = rows_of(mv.source);
    m[4 * i + 2] = mv.target_offset;
    m[4 * i + 3] = rows_of(mv.target);
    fingerprint = fingerprint * 31 + std::hash<std::string>{}(mv.name);
    for (int64_t d : mv.global_shape) fingerprint = fingerprint * 31 + std::hash<int64_t>{}(d);
  }
  m[4 * n] = static_cast<int64_t>(fingerprint & 0x7fffffffffffffffULL);
  auto gathered_meta =
      at::empty({ranks * (4 * n + 1)}, at::TensorOptions().dtype(at::kLong).device(world.device()));
  world.all_gather(gathered_meta, mine.to(world.device()))->wait();
  const auto all = gathered_meta.cpu();
  const auto* a = all.data_ptr<int64_t>();
  auto at_ = [&](int r, int64_t i, int k) { return a[r * (4 * n + 1) + 4 * i + k]; };

  std::string error;
  for (int r = 0; r < ranks && error.empty(); ++r) {
    if (a[r * (4 * n + 1) + 4 * n] != m[4 * n]) {
      error = fmt::format("rank {} holds other tensors (names or shapes) than rank {}", r,
                          world.rank());
    }
  }
  for (int64_t i = 0; i < n && error.empty(); ++i) {
    std::vector<std::pair<int64_t, int64_t>> provided;
    for (int r = 0; r < ranks; ++r) {
      if (at_(r, i, 1) > 0) provided.emplace_back(at_(r, i, 0), at_(r, i, 0) + at_(r, i, 1));
    }
    for (int r = 0; r < ranks; ++r) {
      const int64_t b = at_(r, i, 2), e = b + at_(r, i, 3);
      if (b < e && !covered(b, e, provided)) {
        error = fmt::format("no rank holds every row of '{}' that rank {} needs (rows {} to {})",
                            moves[i].name, r, b, e - 1);
        break;
      }
    }
  }
  FSDP_CHECK_ARG(error.empty(), "state dict: {}", error);

  at::NoGradGuard no_grad;
  for (int64_t i = 0; i < n; ++i) {
    Move& mv = moves[i];
    bool local = true;
    int64_t most = 0;
    for (int r = 0; r < ranks; ++r) {
      local = local && at_(r, i, 0) == at_(r, i, 2) && at_(r, i, 1) == at_(r, i, 3);
      most = std::max(most, at_(r, i, 1));
    }
    if (local) {
      if (mv.target.defined() && rows_of(mv.target) > 0) mv.target.copy_(mv.source);
      continue;
    }
    // Every rank's provided rows, padded to the most any rank provides, one all-gather.
    const int64_t per_row = row_numel(mv.global_shape);
    const auto opts = at::TensorOptions().dtype(mv.target.scalar_type()).device(world.device());
    auto send = at::zeros({most * per_row}, opts);
    if (rows_of(mv.source) > 0) {
      send.narrow(0, 0, rows_of(mv.source) * per_row).copy_(mv.source.reshape(-1));
    }
    auto gathered = at::empty({ranks * most * per_row}, opts);
    world.all_gather(gathered, send)->wait();
    if (!mv.target.defined() || rows_of(mv.target) == 0) continue;
    auto target_rows = mv.target.reshape({rows_of(mv.target), per_row});
    const int64_t tb = mv.target_offset, te = tb + rows_of(mv.target);
    for (int r = 0; r < ranks; ++r) {
      const int64_t sb = at_(r, i, 0), se = sb + at_(r, i, 1);
      const int64_t b = std::max(sb, tb), e = std::min(se, te);
      if (b >= e) continue;
      auto from = gathered.narrow(0, r * most * per_row, most * per_row).view({most, per_row});
      target_rows.narrow(0, b - tb, e - b).copy_(from.narrow(0, b - sb, e - b));
    }
    if (!target_rows.is_same(mv.target) && target_rows.data_ptr() != mv.target.data_ptr()) {
      mv.target.copy_(target_rows.view(mv.target.sizes()));
    }
  }
}

}  // namespace fsdp::detail
