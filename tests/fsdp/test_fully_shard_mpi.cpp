// fully_shard over real MPI processes (ctest runs it under mpiexec -n 2, 3, 4): the same
// equivalence as the thread-rank tests, each process computing the reference itself.
#include <gtest/gtest.h>

#include "train_harness.h"

namespace fsdp::testing {
namespace {

constexpr double kTolerance = 1e-5;

ProcessGroupPtr& world() {
  static ProcessGroupPtr pg;
  return pg;
}

TEST(FullyShardMpi, Fp32MatchesSingleProcess) {
  TrainSpec spec;
  auto want = train_reference(spec, world()->size());
  auto got = train_sharded(spec, world());
  double loss_err = max_rel_loss_error(got, want), param_err = max_rel_param_error(got, want);
  if (world()->rank() == 0) {
    std::cout << "mpi fp32 world " << world()->size() << ": loss rel err " << loss_err
              << ", param rel err " << param_err << "\n";
  }
  EXPECT_LT(loss_err, kTolerance);
  EXPECT_LT(param_err, kTolerance);
}

TEST(FullyShardMpi, MixedPrecisionMatchesReferenceWithSameCasts) {
  TrainSpec spec;
  spec.mp.param_dtype = at::kBFloat16;
  spec.mp.reduce_dtype = at::kFloat;
  auto want = train_reference(spec, world()->size());
  auto got = train_sharded(spec, world());
  double loss_err = max_rel_loss_error(got, want), param_err = max_rel_param_error(got, want);
  if (world()->rank() == 0) {
    std::cout << "mpi bf16/fp32 world " << world()->size() << ": loss rel err " << loss_err
              << ", param rel err " << param_err << "\n";
  }
  EXPECT_LT(loss_err, kTolerance);
  EXPECT_LT(param_err, kTolerance);
}

TEST(FullyShardMpi, ReshardAfterForwardFalseMatches) {
  TrainSpec keep;
  keep.reshard_after_forward = false;
  keep.steps = 4;
  TrainSpec free = keep;
  free.reshard_after_forward = true;
  auto a = train_sharded(keep, world());
  auto b = train_sharded(free, world());
  EXPECT_EQ(max_rel_param_error(a, b), 0.0);
}

}  // namespace
}  // namespace fsdp::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  torch::set_num_threads(1);
  auto d = fsdp::init_from_env();
  fsdp::testing::world() = d.group;
  if (d.group->rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  auto failed = at::full({1}, rc != 0 ? 1 : 0, at::kInt);
  d.group->all_reduce(failed, fsdp::ReduceOp::kSum)->wait();
  fsdp::testing::world().reset();
  d.group.reset();
  return failed.item<int>() != 0 ? 1 : 0;
}
