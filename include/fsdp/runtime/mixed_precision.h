// Mixed precision as FSDP2's MixedPrecisionPolicy defines it.
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>

namespace fsdp {

struct MixedPrecisionPolicy {
  // Dtype of the gathered (full) parameters and so of forward/backward compute; unset keeps
  // the parameters' original dtype. Shards and optimizer state always stay in the original
  // dtype (fp32 master weights).
  std::optional<c10::ScalarType> param_dtype;
  // Dtype of the gradient reduce-scatter; unset uses param_dtype (or the original dtype).
  std::optional<c10::ScalarType> reduce_dtype;
  // Floating outputs of the unit's forward are cast to this dtype; unset leaves them.
  std::optional<c10::ScalarType> output_dtype;
  // Cast floating tensor arguments of the unit's forward to param_dtype.
  bool cast_forward_inputs = true;
};

}  // namespace fsdp
