// Internal: FSDP_RANGE("fsdp::...") names the enclosing scope as a range in libtorch's profiler
// (Chrome/Perfetto traces; include/fsdp/profiler.h lists the names). With no profiler running
// it costs a check of libtorch's callback flags.
#pragma once

#include <ATen/record_function.h>

#include <vector>

#define FSDP_RANGE(name) RECORD_FUNCTION(name, std::vector<c10::IValue>())
