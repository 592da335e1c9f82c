// Umbrella header: everything a training program needs from fsdp.
#pragma once

#include "fsdp/backends.h"
#include "fsdp/clip_grad.h"
#include "fsdp/comm_stats.h"
#include "fsdp/device_memory.h"
#include "fsdp/errors.h"
#include "fsdp/fake_group.h"
#include "fsdp/fully_shard.h"
#include "fsdp/fused_adamw.h"
#include "fsdp/launch.h"
#include "fsdp/local_group.h"
#include "fsdp/memory_stats.h"
#include "fsdp/mixed_precision.h"
#include "fsdp/process_group.h"
#include "fsdp/safetensors.h"
#include "fsdp/sharding.h"
#include "fsdp/work.h"
