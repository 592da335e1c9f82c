// Deprecated path (since 0.2.0): include fsdp/comm/backends.h.
#pragma once

#include "fsdp/comm/backends.h"
