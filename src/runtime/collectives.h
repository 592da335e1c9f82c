// Internal: the copies in and out of the flat buffers of a unit's collectives (FSDP2's
// _fsdp_collectives.py: foreach_all_gather, foreach_all_gather_copy_out, foreach_reduce).
// ParamGroup decides when to run them; where each parameter's elements go is the flat layout
// (fsdp/runtime/layout.h).
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/runtime/layout.h"
#include "runtime/accounting.h"
#include "runtime/fsdp_param.h"

namespace fsdp::detail {

// Writes this rank's shards into `send` (layout.total elements), padding zeroed.
void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send);
// Fills every parameter's full tensor from `gathered` (group.size() * layout.total elements,
// the parameters sharded over `group`'s ranks) and points the parameter at it.
void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, const ProcessGroup& group, Accounting& acct);
// Writes, from the full parameters, the rows rank `rank` of `world` owns into `dst`
// (layout.total elements of a layout over `world` ranks), padding zeroed.
void copy_rows_for_rank(const std::vector<FsdpParam>& params, const FlatLayout& layout, int rank,
                        int world, const at::Tensor& dst);

// Moves every full gradient into `send` (world * layout.total elements, the reduce dtype), each
// rank's rows at its place, zeros for padding and missing gradients. Returns, per parameter,
// whether it had a gradient.
std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world);
// Adds this rank's reduced rows (`reduced`, layout.total elements) into the sharded gradients
// of the parameters that had one.
void reduce_scatter_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                             const at::Tensor& reduced, const std::vector<bool>& had_grad);

// The full tensor of shape `full_shape` whose rows are sharded over `pg` by shard_range, from
// this rank's rows `shard`, on every rank: one all-gather of padded rows (collective).
at::Tensor all_gather_full(ProcessGroup& pg, const at::Tensor& shard,
                           const std::vector<int64_t>& full_shape);

}  // namespace fsdp::detail
