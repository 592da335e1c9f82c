// Collective test bodies shared by every backend's tests (local threads, MPI, Gloo): each rank
// calls them with its group, and checks values computed from rank and world size.
#pragma once

#include <gtest/gtest.h>

#include <vector>

#include "comm/dtype_tolerance.h"
#include "fsdp/comm/process_group.h"

namespace fsdp::testing {

inline std::vector<at::ScalarType> collective_dtypes() {
  return {at::kFloat, at::kBFloat16, at::kHalf, at::kDouble, at::kInt, at::kLong, at::kByte};
}

inline bool is_floating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kBFloat16 || t == at::kHalf;
}

// Numels that do not divide by the world sizes tested, and the empty and single cases.
inline std::vector<int64_t> collective_numels() { return {0, 1, 7, 1001}; }

// Element i of rank r: quarters below 5 for floats (exact in bfloat16, and so are their sums
// over up to 4 ranks), small integers otherwise.
inline at::Tensor rank_values(int rank, int64_t n, at::ScalarType dtype) {
  auto i = at::arange(n, at::kDouble);
  auto v = (rank + 1) * 4.0 + at::remainder(i, 4);
  if (is_floating(dtype)) v = v * 0.25;
  return v;
}

inline void expect_close(const at::Tensor& got, const at::Tensor& want_double, const char* what) {
  auto want = want_double.to(got.scalar_type()).to(at::kDouble);
  auto g = got.to(at::kDouble).view(-1);
  const double tol = collective_tolerance(got.scalar_type());
  ASSERT_EQ(g.numel(), want.numel()) << what;
  EXPECT_TRUE(at::allclose(g, want.view(-1), tol, tol))
      << what << " dtype " << c10::toString(got.scalar_type()) << " numel " << g.numel()
      << "\n got  " << g.narrow(0, 0, std::min<int64_t>(8, g.numel())) << "\n want "
      << want.view(-1).narrow(0, 0, std::min<int64_t>(8, g.numel()));
}

inline std::vector<ReduceOp> ops_for(at::ScalarType dtype) {
  if (is_floating(dtype)) return {ReduceOp::kSum, ReduceOp::kAvg};
  return {ReduceOp::kSum};
}

inline void check_all_gather(ProcessGroup& pg, at::ScalarType dtype, int64_t n) {
  int w = pg.size();
  auto input = rank_values(pg.rank(), n, dtype).to(dtype);
  auto output = at::full({w * n}, -1, at::TensorOptions().dtype(dtype));
  pg.all_gather(output, input)->wait();
  std::vector<at::Tensor> parts;
  for (int r = 0; r < w; ++r) parts.push_back(rank_values(r, n, dtype));
  expect_close(output, at::cat(parts), "all_gather");
}

inline void check_reduce_scatter(ProcessGroup& pg, at::ScalarType dtype, int64_t n, ReduceOp op) {
  int w = pg.size();
  auto input = rank_values(pg.rank(), w * n, dtype).to(dtype);
  auto output = at::full({n}, -1, at::TensorOptions().dtype(dtype));
  pg.reduce_scatter(output, input, op)->wait();
  auto want = at::zeros({n}, at::kDouble);
  for (int r = 0; r < w; ++r) want += rank_values(r, w * n, dtype).narrow(0, pg.rank() * n, n);
  if (op == ReduceOp::kAvg) want /= w;
  expect_close(output, want, op == ReduceOp::kAvg ? "reduce_scatter avg" : "reduce_scatter sum");
}

inline void check_all_reduce(ProcessGroup& pg, at::ScalarType dtype, int64_t n, ReduceOp op) {
  int w = pg.size();
  auto tensor = rank_values(pg.rank(), n, dtype).to(dtype);
  pg.all_reduce(tensor, op)->wait();
  auto want = at::zeros({n}, at::kDouble);
  for (int r = 0; r < w; ++r) want += rank_values(r, n, dtype);
  if (op == ReduceOp::kAvg) want /= w;
  expect_close(tensor, want, op == ReduceOp::kAvg ? "all_reduce avg" : "all_reduce sum");
}

inline void check_broadcast(ProcessGroup& pg, at::ScalarType dtype, int64_t n) {
  int root = pg.size() - 1;
  auto tensor = rank_values(pg.rank(), n, dtype).to(dtype);
  pg.broadcast(tensor, root)->wait();
  expect_close(tensor, rank_values(root, n, dtype), "broadcast");
}

// Every collective, dtype, op and numel.
inline void check_every_collective(ProcessGroup& pg) {
  for (auto dtype : collective_dtypes()) {
    for (auto n : collective_numels()) {
      check_all_gather(pg, dtype, n);
      for (auto op : ops_for(dtype)) {
        check_reduce_scatter(pg, dtype, n, op);
        check_all_reduce(pg, dtype, n, op);
      }
      check_broadcast(pg, dtype, n);
    }
  }
  pg.barrier()->wait();
}

// 16-bit sums accumulate in float32: rank 0 adds 256 and every other rank 1. Summed in bfloat16
// hop by hop, 256 + 1 rounds back to 256 every time; in float32 the total is 256 + (w - 1),
// which bfloat16 represents exactly for w = 3 and rounds to 260 for w = 4.
inline void check_bf16_accumulates_in_fp32(ProcessGroup& pg) {
  int w = pg.size();
  auto t = at::full({5}, pg.rank() == 0 ? 256.0 : 1.0, at::kBFloat16);
  pg.all_reduce(t, ReduceOp::kSum)->wait();
  auto want = at::full({5}, 256.0 + (w - 1), at::kFloat).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(t, want)) << "all_reduce bf16 got " << t[0].item<float>() << " want "
                                  << want[0].item<float>();
  auto in = at::full({5 * w}, pg.rank() == 0 ? 256.0 : 1.0, at::kBFloat16);
  auto out = at::empty({5}, at::kBFloat16);
  pg.reduce_scatter(out, in, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(out, want)) << "reduce_scatter bf16 got " << out[0].item<float>();
}

// Many collectives issued before any wait run in order and all complete.
inline void check_async_in_order(ProcessGroup& pg) {
  int w = pg.size();
  std::vector<at::Tensor> outs;
  std::vector<WorkPtr> works;
  for (int k = 0; k < 8; ++k) {
    auto in = at::full({3}, pg.rank() * 10 + k, at::kFloat);
    outs.push_back(at::empty({3 * w}, at::kFloat));
    works.push_back(pg.all_gather(outs.back(), in));
  }
  for (auto& work : works) work->wait();
  for (int k = 0; k < 8; ++k) {
    for (int r = 0; r < w; ++r) {
      EXPECT_EQ(outs[k][r * 3].item<float>(), r * 10 + k) << "op " << k << " slot " << r;
    }
    EXPECT_TRUE(works[k]->is_completed());
  }
}

// Sub-groups by parity of rank: each sums its members' ranks.
inline void check_split(ProcessGroup& pg) {
  int color = pg.rank() % 2;
  auto sub = pg.split(color);
  int expected_size = 0, expected_sum = 0, expected_rank = 0;
  for (int r = 0; r < pg.size(); ++r) {
    if (r % 2 != color) continue;
    if (r < pg.rank()) ++expected_rank;
    ++expected_size;
    expected_sum += r;
  }
  ASSERT_EQ(sub->size(), expected_size);
  EXPECT_EQ(sub->rank(), expected_rank);
  auto t = at::full({2}, pg.rank(), at::kFloat);
  sub->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_EQ(t[0].item<float>(), expected_sum);
  EXPECT_EQ(sub->backend_name(), pg.backend_name());
}

}  // namespace fsdp::testing
