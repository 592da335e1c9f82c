// Which Linears of a model train in float8 (fsdp/ops/float8.h), as a plain struct that option
// parsers include without the model's headers.
#pragma once

#include <string>
#include <vector>

#include "fsdp/ops/float8_scaling.h"

namespace fsdp::models {

// float8 training of a model's Linears (fsdp/ops/float8.h: torchao's Float8Linear recipe
// "tensorwise", or "rowwise"): their three GEMMs in float8; the master weights, gradients and
// optimizer state as without. Llama: the decoder layers' Linears but those named in `skip` (q_proj,
// k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj), as TorchTitan's filter_fqns; the
// embedding, norms, attention and head stay in the compute dtype (llama::validate_float8 checks a
// model). On a GPU a small GEMM gains nothing: Llama-3.2-1B's 2048 x 512 k and v projections ran at
// 0.89x of bf16 in float8 on an H200.
// `scaling`: torchao's recipe, tensorwise (its default) or rowwise (fsdp/ops/float8_scaling.h);
// a float8 all-gather needs tensorwise.
struct Float8Options {
  bool enabled = false;
  std::vector<std::string> skip;
  ops::Float8Scaling scaling = ops::Float8Scaling::tensorwise;
};

}  // namespace fsdp::models
