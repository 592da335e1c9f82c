// Deprecated path (since 0.2.0): include fsdp/launch/launch.h.
// LaunchInfo::launcher, InitOptions::backend and InitOptions::device are enums now; 0.1.0's
// strings still compile (deprecated, fsdp/launch/launch.h).
#pragma once

#include "fsdp/launch/launch.h"
