// A peer that dies must make the others fail, not hang. Under scripts/launch.sh --nproc 2 with
// Gloo: rank 1 leaves after the first barrier (exit status 0, so the launcher does not stop
// anyone); rank 0's next collective must raise CommError within the group's timeout.
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "fsdp/fsdp.h"

int main() {
  fsdp::InitOptions options;
  options.timeout = std::chrono::seconds(20);
  auto d = fsdp::init_from_env(options);
  d.group->barrier()->wait();
  if (d.group->rank() == 1) {
    // Let rank 0 finish the barrier first (gloo's last message may still be in flight), then
    // vanish without any goodbye, as a crashed process would.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    std::_Exit(0);
  }
  auto start = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 100; ++i) {
      auto t = at::ones({1024});
      d.group->all_reduce(t, fsdp::ReduceOp::kSum)->wait();
    }
  } catch (const fsdp::CommError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "rank 0 failed as expected after " << s << " s: " << e.what() << "\n";
    return 0;
  }
  std::cout << "rank 0: collectives with a dead peer did not fail\n";
  return 1;
}
