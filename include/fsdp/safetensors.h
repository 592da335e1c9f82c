// Deprecated path (since 0.2.0): include fsdp/io/safetensors.h.
#pragma once

#include "fsdp/io/safetensors.h"
