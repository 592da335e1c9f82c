// Two real NCCL ranks: every collective on CUDA tensors with values derived from the rank, a
// split, and fully_shard against one process. Launched by scripts/gpu_check.sh as two processes
// with torchrun-style variables and FSDP_BACKEND=nccl; with a single GPU both use cuda:0
// (LOCAL_RANK=0), which NCCL accepts when each process names another host (NCCL_HOSTID) and
// talks over sockets (P2P and SHM off). Not in ctest: it needs a GPU and a launch.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "support/train_harness.h"

namespace fsdp::testing {
namespace {

Distributed& dist() {
  static Distributed d;
  return d;
}

at::Tensor values(int rank, int64_t n) {
  // Quarters below 5: exact in bf16, and so are their sums over two ranks.
  auto i = at::arange(n, at::kDouble);
  return ((rank + 1) * 4.0 + at::remainder(i, 4)) * 0.25;
}

at::Tensor on_gpu(const at::Tensor& t, at::ScalarType dtype) {
  return t.to(dtype).to(dist().device);
}

void expect_equal(const at::Tensor& got, const at::Tensor& want, const char* what) {
  EXPECT_TRUE(at::equal(got.cpu().to(at::kDouble), want.to(got.scalar_type()).to(at::kDouble)))
      << what << " " << c10::toString(got.scalar_type());
}

TEST(NcclTwoRanks, EveryCollective) {
  auto& pg = *dist().group;
  const int w = pg.size(), r = pg.rank();
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t n : {1, 7, 1001, 1 << 20}) {
      auto mine = on_gpu(values(r, n), dtype);
      std::vector<at::Tensor> parts;
      for (int k = 0; k < w; ++k) parts.push_back(values(k, n));
      auto all = at::cat(parts);

      auto gathered = at::empty({w * n}, mine.options());
      pg.all_gather(gathered, mine)->wait();
      expect_equal(gathered, all, "all_gather");

      auto sum = at::zeros({n}, at::kDouble);
      for (const auto& p : parts) sum += p;
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto want = op == ReduceOp::kSum ? sum : sum / w;
        auto t = mine.clone();
        pg.all_reduce(t, op)->wait();
        expect_equal(t, want, "all_reduce");
        // Reduce-scatter of the concatenation: rank r receives the reduction of block r.
        auto in = on_gpu(at::cat(std::vector<at::Tensor>(w, values(r, n))), dtype);
        auto out = at::empty({n}, mine.options());
        pg.reduce_scatter(out, in, op)->wait();
        expect_equal(out, want, "reduce_scatter");
      }
      auto b = mine.clone();
      pg.broadcast(b, 1)->wait();
      expect_equal(b, values(1, n), "broadcast");
    }
  }
  pg.barrier()->wait();
}

TEST(NcclTwoRanks, SplitIntoSingletons) {
  auto child = dist().group->split(dist().group->rank());
  EXPECT_EQ(child->size(), 1);
  EXPECT_EQ(child->rank(), 0);
  auto t = on_gpu(values(dist().group->rank(), 16), at::kFloat);
  auto want = t.cpu();
  child->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), want));
}

// One color: the child holds both ranks. NCCL's split of a non-blocking parent completes with
// the parent's job (the first GPU run read the child first and crashed); afterwards both the
// parent and the child work, also with their collectives interleaved without waits between
// (two communicators of one device run in the host's issue order: nccl_group.cpp).
TEST(NcclTwoRanks, SplitWholeKeepsBothUsable) {
  auto& pg = *dist().group;
  const int w = pg.size(), r = pg.rank();
  auto child = pg.split(/*color=*/0);
  ASSERT_EQ(child->size(), w);
  EXPECT_EQ(child->rank(), r);
  auto sum = at::zeros({1001}, at::kDouble);
  for (int k = 0; k < w; ++k) sum += values(k, 1001);
  std::vector<at::Tensor> tensors;
  std::vector<WorkPtr> works;
  for (int i = 0; i < 16; ++i) {
    tensors.push_back(on_gpu(values(r, 1001), at::kFloat));
    works.push_back((i % 2 ? *child : pg).all_reduce(tensors.back(), ReduceOp::kSum));
  }
  for (auto& work : works) work->wait();
  for (const auto& t : tensors) expect_equal(t, sum, "interleaved all_reduce");
  pg.barrier()->wait();
  child->barrier()->wait();
}

TrainSpec cuda_spec() {
  TrainSpec s;
  s.device = dist().device;
  return s;
}

TEST(NcclTwoRanks, Fp32MatchesSingleProcess) {
  auto s = cuda_spec();
  auto want = train_reference(s, dist().group->size());
  auto got = train_sharded(s, dist().group);
  expect_parity("nccl fp32", dist().group->size(), got, want, 1e-5);
}

TEST(NcclTwoRanks, Bf16MatchesReferenceWithSameCasts) {
  auto s = cuda_spec();
  s.mp.param_dtype = at::kBFloat16;
  s.mp.reduce_dtype = at::kFloat;
  auto want = train_reference(s, dist().group->size());
  auto got = train_sharded(s, dist().group);
  expect_parity("nccl bf16/fp32", dist().group->size(), got, want, 1e-3);
}

TEST(NcclTwoRanks, HybridTwoReplicasMatchesPlain) {
  // Two replicas of one shard each: gradients all-reduced across them (the replicate group).
  auto s = cuda_spec();
  s.steps = 4;
  auto mesh = make_device_mesh(dist().group, /*replicas=*/2);
  auto plain = train_sharded(s, dist().group);
  auto hybrid = train_sharded(s, mesh);
  EXPECT_LT(max_rel_loss_error(hybrid, plain), 1e-5);
}

}  // namespace
}  // namespace fsdp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // CUDA's embedding backward sums with atomics unless deterministic algorithms are on.
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/true);
  auto& d = fsdp::testing::dist();
  d = fsdp::init_from_env();
  if (d.group->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  const int rc = RUN_ALL_TESTS();
  // One verdict on every rank (a CUDA tensor: NCCL takes nothing else).
  auto failed =
      at::full({1}, rc != 0 ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(d.device));
  d.group->all_reduce(failed, fsdp::ReduceOp::kSum)->wait();
  const int verdict = failed.item<int>() != 0 ? 1 : 0;
  d.group.reset();
  return verdict;
}
