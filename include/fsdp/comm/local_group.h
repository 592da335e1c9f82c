// The thread-rank group: N ranks as N threads of one process, for tests and single-machine
// experiments (the fake group, which plays one rank of a large world: fake_group.h).
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp {

// N ranks as N threads of one process sharing memory ("local" backend): same interface and
// real numbers as a real backend. Rank r's group must be used from one thread (rank r's).
// Each collective waits at most `timeout` for its peers, then throws TimeoutError, so a rank
// thread that died or issued a different sequence makes the others fail instead of hang.
// A mismatch of operation, numel or dtype between ranks throws CommError on every rank.
// CPU tensors only: on one GPU, thread ranks cannot block inside backward (docs/libtorch.md).
struct LocalGroupOptions {
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
};
std::vector<ProcessGroupPtr> make_local_groups(int world_size, LocalGroupOptions options = {});

// Runs body(group) for every rank of a new local world on its own thread, joins them, and
// rethrows the exception thrown first in time (the cause; the others are usually timeouts it
// caused), after all threads finished.
void run_local_ranks(int world_size, const std::function<void(const ProcessGroupPtr&)>& body,
                     LocalGroupOptions options = {});

}  // namespace fsdp
