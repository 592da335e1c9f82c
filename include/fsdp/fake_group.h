// Deprecated path (since 0.2.0): include fsdp/comm/fake_group.h.
#pragma once

#include "fsdp/comm/fake_group.h"
