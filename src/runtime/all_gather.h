// Internal: the copies in and out of a unit's all-gather buffers (FSDP2's _fsdp_collectives.py:
// foreach_all_gather, foreach_all_gather_copy_out). ParamGroup decides when to run them; where
// each parameter's elements go is the flat layout (fsdp/runtime/layout.h).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "fsdp/runtime/layout.h"
#include "runtime/fsdp_param.h"

namespace fsdp::detail {

// Writes this rank's shards into `send` (layout.total elements), padding zeroed. The shards
// may be in host memory and `send` on the device (offload): `non_blocking` copies them
// asynchronously (from pinned memory).
void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send, bool non_blocking = false);
// Fills every parameter's full tensor (its bytes attached: FsdpParam::attach_full) from
// `gathered` (world * layout.total elements, the parameters sharded over `world` ranks) and
// points the parameter at it.
void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, int world);
// Writes, from the full parameters, the rows rank `rank` of `world` owns into `dst`
// (layout.total elements of a layout over `world` ranks), padding zeroed.
void copy_rows_for_rank(const std::vector<FsdpParam>& params, const FlatLayout& layout, int rank,
                        int world, const at::Tensor& dst);

}  // namespace fsdp::detail
