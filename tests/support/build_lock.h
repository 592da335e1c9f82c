// Thread ranks share libtorch's global generator: the harness's models (TinyLM, EdgeNet) are
// built and seeded one at a time, under this one mutex. (Tests that seed other models in thread
// ranks keep their own lock: tests/models/llama_test_util.h, test_fully_shard_behaviour.cpp.)
#pragma once

#include <mutex>

namespace fsdp::testing {

std::mutex& model_build_mutex();

}  // namespace fsdp::testing
