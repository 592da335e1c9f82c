// Deprecated path (since 0.2.0): include fsdp/comm/device_mesh.h.
#pragma once

#include "fsdp/comm/device_mesh.h"
