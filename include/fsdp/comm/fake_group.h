// The fake group: one rank of a large world in one process, without communication.
#pragma once

#include "fsdp/comm/process_group.h"

namespace fsdp {

// A "fake" group: plays rank `rank` of a world of `world_size` without communicating, as
// PyTorch's FakeProcessGroup does, to test shapes, memory and collective counts of a large
// world in one process. Results are those of a world in which every rank holds the same data:
// all_gather repeats the input in every slot; a sum multiplies by world_size; an average and
// broadcast leave data unchanged. Works on CPU or CUDA tensors; every Work is complete at once.
ProcessGroupPtr make_fake_group(int rank, int world_size, at::DeviceType device = at::kCPU);
// The same on one device, say a GPU with its index (device() returns it; with only a type the
// current device is meant).
ProcessGroupPtr make_fake_group(int rank, int world_size, at::Device device);

}  // namespace fsdp
