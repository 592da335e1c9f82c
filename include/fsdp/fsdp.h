// Umbrella header: everything a training program needs from fsdp.
#pragma once

#include "fsdp/errors.h"

// comm: process groups and their engines, the device mesh of hybrid sharding
#include "fsdp/comm/backends.h"
#include "fsdp/comm/device_mesh.h"
#include "fsdp/comm/fake_group.h"
#include "fsdp/comm/local_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/work.h"

// launch: rank, world and engine from the launcher's environment
#include "fsdp/launch/launch.h"

// runtime: fully_shard and what it shares with the tools
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/layout.h"
#include "fsdp/runtime/mixed_precision.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/stats.h"

// checkpoint and io: sharded checkpoints, safetensors files and export
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/state_dict.h"
#include "fsdp/io/safetensors.h"

// optim: the fused AdamW, clipping by the global norm
#include "fsdp/optim/clip_grad.h"
#include "fsdp/optim/fused_adamw.h"

// tools: memory readings, the planner, the profiler
#include "fsdp/tools/memory.h"
#include "fsdp/tools/planner.h"
#include "fsdp/tools/profiler.h"
