// Deprecated path (since 0.2.0): include fsdp/runtime/layout.h.
// ShardRange and shard_range are part of the sharding layout now.
#pragma once

#include "fsdp/runtime/layout.h"
