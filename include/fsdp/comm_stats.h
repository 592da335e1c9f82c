// Deprecated path (since 0.2.0): include fsdp/runtime/stats.h.
// CommStats now lives beside MemoryStats.
#pragma once

#include "fsdp/runtime/stats.h"
