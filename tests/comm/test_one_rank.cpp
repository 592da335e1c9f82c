// A group of one rank never calls its engine (every backend: the base class answers): the
// collectives' results are local copies, counted as the group's collectives, and complete at
// once. NCCL's ncclAvg on one rank left the last elements unprocessed (NVIDIA/nccl issue 1950),
// which every world-1 run and every one-rank shard group of a hybrid mesh would have read.
#include <gtest/gtest.h>

#include "fsdp/comm/local_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/errors.h"

namespace fsdp::testing {
namespace {

// An engine that must not be reached: every operation fails the test.
class UnreachableEngine final : public ProcessGroup {
 public:
  UnreachableEngine() : ProcessGroup(0, 1) {}
  Backend backend() const override { return Backend::kLocal; }
  at::DeviceType device_type() const override { return at::kCPU; }
  int engine_calls = 0;

 protected:
  WorkPtr do_all_gather(const at::Tensor&, const at::Tensor&) override { return reached(); }
  WorkPtr do_reduce_scatter(const at::Tensor&, const at::Tensor&, ReduceOp) override {
    return reached();
  }
  WorkPtr do_all_reduce(const at::Tensor&, ReduceOp) override { return reached(); }
  WorkPtr do_broadcast(const at::Tensor&, int) override { return reached(); }
  WorkPtr do_barrier() override { return reached(); }

 private:
  WorkPtr reached() {
    ++engine_calls;
    throw Error("the engine was called for a one-rank group");
  }
};

void expect_local_answers(ProcessGroup& pg) {
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
    auto in = at::arange(1003, at::TensorOptions().dtype(dtype));  // odd: no aligned tail
    auto out = at::full({1003}, -1, in.options());
    auto w = pg.all_gather(out, in);
    EXPECT_TRUE(w->is_completed());
    w->wait();
    EXPECT_TRUE(at::equal(out, in)) << c10::toString(dtype);
    if (dtype != at::kLong) {
      for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto reduced = at::full({1003}, -1, in.options());
        pg.reduce_scatter(reduced, in, op)->wait();
        EXPECT_TRUE(at::equal(reduced, in)) << "every element, the last ones too";
      }
    }
    auto t = in.clone();
    pg.all_reduce(t, ReduceOp::kSum)->wait();
    pg.broadcast(t, 0)->wait();
    EXPECT_TRUE(at::equal(t, in));
  }
  pg.barrier()->wait();
  // Still validated: a wrong size is refused as before.
  EXPECT_THROW(pg.all_gather(at::empty({4}), at::empty({3})), InvalidArgument);
}

TEST(OneRankGroup, NeverCallsTheEngine) {
  UnreachableEngine pg;
  expect_local_answers(pg);
  EXPECT_EQ(pg.engine_calls, 0);
  // Counted as the group's collectives (what FSDP asked for), with their input bytes.
  EXPECT_EQ(pg.stats().count(CollectiveKind::kAllGather), 3);
  EXPECT_EQ(pg.stats().count(CollectiveKind::kReduceScatter), 4);
  EXPECT_EQ(pg.stats().bytes_of(CollectiveKind::kAllGather), 1003 * (4 + 2 + 8));
}

TEST(OneRankGroup, EveryEngineAnswersLocally) {
  auto local = make_local_groups(1).front();
  expect_local_answers(*local);
}

}  // namespace
}  // namespace fsdp::testing
