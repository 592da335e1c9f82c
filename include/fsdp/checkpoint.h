// Deprecated path (since 0.2.0): include fsdp/checkpoint/checkpoint.h.
#pragma once

#include "fsdp/checkpoint/checkpoint.h"
