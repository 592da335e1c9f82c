// For test binaries that run as several processes (mpiexec, scripts/launch.sh): runs the
// registered tests on this rank, prints progress on rank 0 only, and returns the same verdict
// on every rank (failing if any rank failed), so the launcher reports one result.
#pragma once

#include <gtest/gtest.h>

#include "fsdp/comm/process_group.h"

namespace fsdp::testing {

inline int run_tests_on_every_rank(ProcessGroup& pg) {
  if (pg.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int rc = RUN_ALL_TESTS();
  auto failed = at::full({1}, rc != 0 ? 1 : 0, at::kInt);
  pg.all_reduce(failed, ReduceOp::kSum)->wait();
  return failed.item<int>() != 0 ? 1 : 0;
}

}  // namespace fsdp::testing
