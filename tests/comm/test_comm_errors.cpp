// Wrong arguments raise InvalidArgument naming the problem, before anything is sent (the
// group's collective counters stay at zero), on any backend: checks live in ProcessGroup.
#include <gtest/gtest.h>

#include "fsdp/comm/backends.h"
#include "fsdp/comm/fake_group.h"
#include "fsdp/comm/local_group.h"
#include "fsdp/errors.h"
#include "support/expect_error.h"

namespace fsdp {
namespace {

template <typename Fn>
void expect_invalid(Fn fn, const std::string& needle) {
  testing::expect_error_containing<InvalidArgument>(fn, needle);
}

class CommErrors : public ::testing::Test {
 protected:
  // A fake rank of a world of 4: argument checks are the same for every backend.
  ProcessGroupPtr pg = make_fake_group(1, 4);
};

TEST_F(CommErrors, NonContiguous) {
  auto t = at::ones({4, 4}).t();
  expect_invalid([&] { pg->all_reduce(t, ReduceOp::kSum); }, "must be contiguous");
  expect_invalid([&] { pg->all_gather(at::empty({64}), t); }, "input must be contiguous");
}

TEST_F(CommErrors, WrongNumel) {
  expect_invalid([&] { pg->all_gather(at::empty({10}), at::empty({3})); },
                 "output numel must be world size x input numel = 4 x 3 = 12, got 10");
  expect_invalid([&] { pg->reduce_scatter(at::empty({3}), at::empty({11}), ReduceOp::kSum); },
                 "input numel must be world size x output numel = 4 x 3 = 12, got 11");
}

TEST_F(CommErrors, DtypeMismatchAndUnsupportedDtype) {
  expect_invalid([&] { pg->all_gather(at::empty({8}, at::kHalf), at::empty({2})); },
                 "output dtype Half differs from input dtype Float");
  expect_invalid([&] { pg->all_reduce(at::ones({2}, at::kBool), ReduceOp::kSum); },
                 "has dtype Bool");
  expect_invalid([&] { pg->all_reduce(at::ones({2}, at::kInt), ReduceOp::kAvg); },
                 "kAvg needs a floating dtype");
}

TEST_F(CommErrors, DeviceMismatch) {
  auto cuda_pg = make_fake_group(0, 2, at::kCUDA);
  expect_invalid([&] { cuda_pg->all_reduce(at::ones({2}), ReduceOp::kSum); },
                 "is on device cpu but the fake process group works on cuda tensors");
}

TEST_F(CommErrors, OverlapAndUndefinedAndRoot) {
  auto buf = at::empty({8});
  expect_invalid([&] { pg->all_gather(buf, buf.narrow(0, 0, 2)); }, "must not overlap");
  expect_invalid([&] { pg->all_reduce(at::Tensor(), ReduceOp::kSum); }, "undefined tensor");
  expect_invalid([&] { pg->broadcast(at::ones({2}), 4); }, "root must be in [0, 4), got 4");
}

TEST_F(CommErrors, NothingWasSent) {
  try {
    pg->all_gather(at::empty({10}), at::empty({3}));
  } catch (const InvalidArgument&) {
  }
  EXPECT_EQ(pg->stats().count(CollectiveKind::kAllGather), 0);
}

TEST(CommErrorText, NamesBackendOpRankAndCause) {
  CommError e("mpi", "all_gather", 2, 4, "MPI_ERR_TRUNCATE");
  EXPECT_STREQ(e.what(), "[mpi rank 2/4] all_gather failed: MPI_ERR_TRUNCATE");
}

TEST(BackendAvailability, MissingEnginesSaySo) {
  if (!has_nccl_backend()) {
    try {
      make_nccl_unique_id();
      FAIL();
    } catch (const UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("FSDP_WITH_NCCL"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace fsdp
