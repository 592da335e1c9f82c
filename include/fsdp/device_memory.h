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

}  // namespace fsdp
