// Thread ranks share libtorch's global generator: the tests' models (TinyLM, EdgeNet) are built
// and seeded one at a time, under this one mutex.
#pragma once

#include <mutex>

namespace fsdp::testing {

std::mutex& model_build_mutex();

}  // namespace fsdp::testing
