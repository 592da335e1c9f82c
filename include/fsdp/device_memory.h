// Deprecated path (since 0.2.0): include fsdp/tools/memory.h.
// The memory readings (cuda_peak_allocated_bytes, host_tensor_memory, ...).
#pragma once

#include "fsdp/tools/memory.h"
