// Deprecated path (since 0.2.0): include fsdp/comm/local_group.h.
#pragma once

#include "fsdp/comm/local_group.h"
