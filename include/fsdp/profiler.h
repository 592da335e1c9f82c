// Deprecated path (since 0.2.0): include fsdp/tools/profiler.h.
#pragma once

#include "fsdp/tools/profiler.h"
