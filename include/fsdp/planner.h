// Deprecated path (since 0.2.0): include fsdp/tools/planner.h.
#pragma once

#include "fsdp/tools/planner.h"
