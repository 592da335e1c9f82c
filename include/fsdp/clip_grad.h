// Deprecated path (since 0.2.0): include fsdp/optim/clip_grad.h.
#pragma once

#include "fsdp/optim/clip_grad.h"
