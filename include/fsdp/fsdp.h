// Umbrella header: everything a training program needs from fsdp.
#pragma once

#include "fsdp/errors.h"

// comm: process groups and their engines, the device mesh of hybrid sharding
#include "fsdp/comm/agree.h"
#include "fsdp/comm/backends.h"
#include "fsdp/comm/device_mesh.h"
#include "fsdp/comm/fake_group.h"
#include "fsdp/comm/local_group.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/comm/work.h"

// launch: rank, world and engine from the launcher's environment
#include "fsdp/launch/launch.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "fsdp/ops/linear_cross_entropy.h"

// io and data: files written durably, safetensors files, token files
#include "fsdp/data/token_file.h"
#include "fsdp/io/files.h"
#include "fsdp/io/safetensors.h"

// runtime: fully_shard, its public shard view, and what it shares with the tools
#include "fsdp/runtime/comm_hooks.h"
#include "fsdp/runtime/fully_shard.h"
#include "fsdp/runtime/layout.h"
#include "fsdp/runtime/lifecycle.h"
#include "fsdp/runtime/mixed_precision.h"
#include "fsdp/runtime/options.h"
#include "fsdp/runtime/sharded_tensor.h"
#include "fsdp/runtime/stats.h"

// checkpoint: state dicts, sharded checkpoints, safetensors export and loading
#include "fsdp/checkpoint/checkpoint.h"
#include "fsdp/checkpoint/export.h"
#include "fsdp/checkpoint/state_dict.h"

// optim: the fused AdamW, clipping by the global norm
#include "fsdp/optim/clip_grad.h"
#include "fsdp/optim/fused_adamw.h"

// tools: memory readings, the planner, the profiler
#include "fsdp/tools/memory.h"
#include "fsdp/tools/planner.h"
#include "fsdp/tools/profiler.h"
