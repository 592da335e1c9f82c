// Internal to the models library, which builds against the library's public headers only:
// argument checks at its public boundary.
#pragma once

#include <fmt/format.h>

#include "fsdp/errors.h"

// Throws fsdp::InvalidArgument with a formatted message when `cond` is false.
#define FSDP_MODEL_CHECK(cond, ...)                                       \
  do {                                                                    \
    if (!(cond)) throw ::fsdp::InvalidArgument(fmt::format(__VA_ARGS__)); \
  } while (0)
