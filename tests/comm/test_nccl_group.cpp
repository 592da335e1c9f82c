// NCCL at world size 1 on a real GPU: the shared collective bodies on CUDA tensors.
// Compiled and linked wherever the CUDA toolkit and NCCL are; skips without a GPU.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include "fsdp/comm/backends.h"
#include "fsdp/errors.h"

namespace fsdp {
namespace {

bool have_gpu() { return at::hasCUDA() && at::getNumGPUs() > 0; }

TEST(NcclGroup, WorldOfOneOnCuda) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible to libtorch";
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  auto opts = at::TensorOptions().device(at::kCUDA, 0);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    auto in = at::arange(7, opts.dtype(dtype));
    auto out = at::empty({7}, opts.dtype(dtype));
    pg->all_gather(out, in)->wait();
    EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));
    pg->reduce_scatter(out, in, ReduceOp::kAvg)->wait();
    EXPECT_TRUE(at::equal(out.cpu(), in.cpu()));
    auto t = in.clone();
    pg->all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_TRUE(at::equal(t.cpu(), in.cpu()));
  }
  pg->barrier()->wait();
}

TEST(NcclGroup, RejectsCpuTensors) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device visible to libtorch";
  auto pg = make_nccl_group(0, 1, 0, make_nccl_unique_id());
  EXPECT_THROW(pg->all_reduce(at::ones({2}), ReduceOp::kSum), Error);
}

}  // namespace
}  // namespace fsdp
