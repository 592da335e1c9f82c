// Internal: how one param group's parameters are laid out in the flat buffers of its two
// collectives, and the copies in and out of those buffers (FSDP2's _fsdp_collectives.py:
// foreach_all_gather, foreach_all_gather_copy_out, foreach_reduce). ParamGroup decides when to
// run them; this file only knows where each parameter's elements go.
//
// Layout: every rank contributes `total` elements, each parameter padded_numel() of them at
// `offset[i]` (its shard rows, then zero padding up to ceil(d0 / world) rows); the gathered or
// reduced buffer holds the ranks' contributions one after another, [world, total].
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "runtime/fsdp_param.h"

namespace fsdp::detail {

struct FlatLayout {
  std::vector<int64_t> offset;  // per parameter; -1 when the parameter is not in the buffer
  int64_t total = 0;            // elements per rank
};

// All parameters (the all-gather), or those that require a gradient (the reduce-scatter).
FlatLayout gather_layout(const std::vector<FsdpParam>& params);
FlatLayout reduce_layout(const std::vector<FsdpParam>& params);

// Writes this rank's shards into `send` (layout.total elements), padding zeroed.
void all_gather_copy_in(const std::vector<FsdpParam>& params, const FlatLayout& layout,
                        const at::Tensor& send);
// Fills every parameter's full tensor from `gathered` (world * layout.total elements) and points
// the parameter at it.
void all_gather_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                         const at::Tensor& gathered, int world);

// Moves every full gradient into `send` (world * layout.total elements, the reduce dtype), each
// rank's rows at its place, zeros for padding and missing gradients. Returns, per parameter,
// whether it had a gradient.
std::vector<bool> reduce_scatter_copy_in(std::vector<FsdpParam>& params, const FlatLayout& layout,
                                         const at::Tensor& send, int world);
// Adds this rank's reduced rows (`reduced`, layout.total elements) into the sharded gradients
// of the parameters that had one.
void reduce_scatter_copy_out(std::vector<FsdpParam>& params, const FlatLayout& layout,
                             const at::Tensor& reduced, const std::vector<bool>& had_grad);

}  // namespace fsdp::detail
