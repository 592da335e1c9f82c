// Deprecated path (since 0.2.0): include fsdp/optim/fused_adamw.h.
#pragma once

#include "fsdp/optim/fused_adamw.h"
