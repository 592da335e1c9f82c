// Internal: argument checks at the library's public boundary.
#pragma once

#include <fmt/format.h>

#include "fsdp/errors.h"

// Throws fsdp::InvalidArgument with a formatted message when `cond` is false.
#define FSDP_CHECK_ARG(cond, ...)                                         \
  do {                                                                    \
    if (!(cond)) throw ::fsdp::InvalidArgument(fmt::format(__VA_ARGS__)); \
  } while (0)
