// Deprecated path (since 0.2.0): include fsdp/checkpoint/export.h.
// ExportOptions, export_safetensors and load_safetensors_sharded.
#pragma once

#include "fsdp/checkpoint/export.h"
