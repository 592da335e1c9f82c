// Deprecated path (since 0.2.0): include fsdp/runtime/stats.h.
// MemoryStats's tree-wide fields moved into MemoryStats::tree; the old names still compile
// (deprecated members, fsdp/runtime/stats.h).
#pragma once

#include "fsdp/runtime/stats.h"
