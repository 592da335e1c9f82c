// Deprecated path (since 0.2.0): include fsdp/runtime/unique_parameters.h.
#pragma once

#include "fsdp/runtime/unique_parameters.h"
