// agree_on (fsdp/comm/agree.h): a phase that fails on some ranks fails on every rank, with the
// same message naming each failed rank, as the error type the caller's contract documents.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "fsdp/comm/agree.h"
#include "fsdp/comm/local_group.h"

namespace fsdp::testing {
namespace {

TEST(Agree, EveryRankThrowsTheSameTypedError) {
  std::vector<std::string> seen(3);
  run_local_ranks(3, [&](const ProcessGroupPtr& pg) {
    const int r = pg->rank();
    // Nobody fails: nothing is thrown, and fn ran on every rank.
    int ran = 0;
    agree_on<CheckpointError>(*pg, "phase 1", [&] { ++ran; });
    EXPECT_EQ(ran, 1);
    // Ranks 0 and 2 fail: all three throw InvalidArgument with both messages, in rank order.
    try {
      agree_on<InvalidArgument>(*pg, "phase 2", [&] {
        if (r != 1) throw std::runtime_error("bad input on " + std::to_string(r));
      });
      ADD_FAILURE() << "rank " << r << " did not throw";
    } catch (const InvalidArgument& e) {
      seen[r] = e.what();
    }
    // An exception without a message still counts as a failure.
    EXPECT_THROW(agree_on<CheckpointError>(*pg, "phase 3",
                                           [&] {
                                             if (r == 2) throw std::runtime_error("");
                                           }),
                 CheckpointError);
  });
  for (const auto& s : seen) {
    EXPECT_EQ(s, "phase 2: rank 0: bad input on 0; rank 2: bad input on 2");
  }
}

TEST(Agree, StringsInRankOrder) {
  run_local_ranks(3, [&](const ProcessGroupPtr& pg) {
    const auto all = all_gather_strings(*pg, std::string(pg->rank() * 2, 'x'));
    EXPECT_EQ(all, (std::vector<std::string>{"", "xx", "xxxx"}));
  });
}

}  // namespace
}  // namespace fsdp::testing
