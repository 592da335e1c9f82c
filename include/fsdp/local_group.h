// In-process test groups: how multi-rank logic is tested inside one process.
#pragma once

#include <chrono>
#include <functional>
#include <vector>

#include "fsdp/process_group.h"

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

// A "fake" group: plays rank `rank` of a world of `world_size` without communicating, as
// PyTorch's FakeProcessGroup does, to test shapes, memory and collective counts of a large
// world in one process. Results are those of a world in which every rank holds the same data:
// all_gather repeats the input in every slot; a sum multiplies by world_size; an average and
// broadcast leave data unchanged. Works on CPU or CUDA tensors; every Work is complete at once.
ProcessGroupPtr make_fake_group(int rank, int world_size, at::DeviceType device = at::kCPU);

}  // namespace fsdp
