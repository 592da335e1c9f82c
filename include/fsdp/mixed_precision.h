// Deprecated path (since 0.2.0): include fsdp/runtime/mixed_precision.h.
#pragma once

#include "fsdp/runtime/mixed_precision.h"
