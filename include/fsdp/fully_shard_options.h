// Options of fully_shard (fully_shard.h).
#pragma once

#include <optional>

#include "fsdp/mixed_precision.h"

namespace fsdp {

struct FullyShardOptions {
  MixedPrecisionPolicy mp_policy;
  // Free the full parameters after forward and gather them again for backward. Unset: true,
  // except for the root unit, which keeps them (it is the first to run backward).
  std::optional<bool> reshard_after_forward;
};

}  // namespace fsdp
