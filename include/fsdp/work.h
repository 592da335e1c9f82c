// Deprecated path (since 0.2.0): include fsdp/comm/work.h.
#pragma once

#include "fsdp/comm/work.h"
