// Deprecated path (since 0.2.0): include fsdp/runtime/options.h.
// FullyShardOptions.
#pragma once

#include "fsdp/runtime/options.h"
