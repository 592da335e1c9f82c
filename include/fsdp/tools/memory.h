// Peak memory of a rank's device, for reports. On CUDA it is the caching allocator's peak of
// allocated bytes; that needs a CUDA build of libtorch, so elsewhere it reports unavailable.
#pragma once

#include <cstdint>

namespace fsdp {

// Peak bytes allocated on CUDA device `device` since start or the last reset; -1 when this
// build cannot read the CUDA allocator (CPU-only libtorch).
int64_t cuda_peak_allocated_bytes(int device);
void cuda_reset_peak_allocated_bytes(int device);

// This process's peak resident set size in bytes (getrusage), the CPU analogue.
int64_t host_peak_rss_bytes();

// CPU tensor bytes, the CPU analogue of the CUDA allocator's allocated bytes: libtorch keeps no
// such count for CPU tensors, and RSS also holds libtorch's code, the allocator's free lists
// and everything else. track_host_tensor_memory() installs a counting CPU allocator (c10's
// own aligned allocation, plus a table of live sizes): tensors allocated after the call are
// counted, from every thread; earlier ones are not. Idempotent; costs one locked table update
// per allocation and free. Call it first thing in main for totals that include the model.
void track_host_tensor_memory();
struct HostTensorMemory {
  bool tracking = false;  // track_host_tensor_memory() was called
  int64_t allocated = 0;  // bytes of live CPU tensors allocated since then
  int64_t peak = 0;       // the most `allocated` reached since then or the last reset
};
HostTensorMemory host_tensor_memory();
void reset_host_tensor_peak();  // peak := allocated

}  // namespace fsdp
