// Umbrella header: everything a training program needs from fsdp.
#pragma once

#include "fsdp/backends.h"
#include "fsdp/errors.h"
#include "fsdp/launch.h"
#include "fsdp/local_group.h"
#include "fsdp/process_group.h"
#include "fsdp/work.h"
