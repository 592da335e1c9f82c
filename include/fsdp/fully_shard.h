// Deprecated path (since 0.2.0): include fsdp/runtime/fully_shard.h.
#pragma once

#include "fsdp/runtime/fully_shard.h"
