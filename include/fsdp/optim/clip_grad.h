// Gradient clipping by the global norm for sharded parameters.
//
// libtorch's torch::nn::utils::clip_grad_norm_ called on a rank's shards computes the norm of
// that rank's shards only, so every rank would scale by a different factor: wrong for FSDP.
// fsdp::clip_grad_norm_ combines every rank's shards with one collective and scales all of them
// by the same factor, which makes a sharded run equal the unsharded one clipped with libtorch's
// function (tests/optim/test_clip_grad.cpp).
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "fsdp/comm/device_mesh.h"
#include "fsdp/comm/process_group.h"
#include "fsdp/parallel/tensor_parallel.h"
#include "fsdp/runtime/fully_shard.h"

namespace fsdp {

// The total p-norm of the gradients of `params` (this rank's shards, sharded over `pg`;
// parameters without a gradient are skipped) over all ranks of `pg`: (sum over ranks and parameters
// of |g|^p)^(1/p), or the largest |g| for p = infinity. Every gradient is then multiplied by min(1,
// max_norm / (total + 1e-6)), as torch::nn::utils::clip_grad_norm_ does. Returns the total norm,
// the same on every rank. One all_gather of one double per rank; every rank must call it. Gradients
// may mix dtypes (norms combine in double precision).
//
// Throws InvalidArgument, before touching any gradient, when max_norm is not a positive finite
// number or norm_type is not positive (infinity allowed); with error_if_nonfinite, Error when
// the total norm is NaN or infinite (then no gradient is scaled), on every rank alike.
double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const ProcessGroupPtr& pg, double norm_type = 2.0,
                       bool error_if_nonfinite = false);

// The same total norm without scaling anything: for logging, or to skip a step whose
// gradients are not finite (a NaN or infinity on any rank makes it NaN or infinity on every
// rank). Collective; InvalidArgument for a non-positive norm_type.
double total_grad_norm(const std::vector<at::Tensor>& params, const ProcessGroupPtr& pg,
                       double norm_type = 2.0);

// Hybrid sharding (device_mesh.h): the replicas hold the same gradient shards, so the norm is
// combined over mesh.shard only.
double clip_grad_norm_(const std::vector<at::Tensor>& params, double max_norm,
                       const DeviceMesh& mesh, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
double total_grad_norm(const std::vector<at::Tensor>& params, const DeviceMesh& mesh,
                       double norm_type = 2.0);

// The model's gradients, whatever its layout: each unit's shards combined over the group that
// shards them (with hybrid sharding, once per replica), and parameters outside every unit (or
// ignored by fully_shard), which every rank holds whole, counted once. The form to prefer:
// the groups come from the model, so no layout can be passed wrong.
// Tensor parallelism (DeviceMesh::tp): the parameters whose names `sliced` accepts hold a
// different slice on each rank of `group` (their parts are summed over it); every other
// parameter is equal on every rank of `group` (counted once). The result is the norm of the
// full model's gradients, the same on every rank.
struct TensorParallelNorm {
  ProcessGroupPtr group;
  std::function<bool(const std::string& name)> sliced;
};
double clip_grad_norm_(const FSDPModule& model, double max_norm, const TensorParallelNorm& tp,
                       double norm_type = 2.0, bool error_if_nonfinite = false);
double total_grad_norm(const FSDPModule& model, const TensorParallelNorm& tp,
                       double norm_type = 2.0);
// The same from a model's tensor-parallel layout (its slices by name; llama::tp_layout).
double clip_grad_norm_(const FSDPModule& model, double max_norm, const tp::Layout& tp,
                       double norm_type = 2.0, bool error_if_nonfinite = false);
double total_grad_norm(const FSDPModule& model, const tp::Layout& tp, double norm_type = 2.0);

double clip_grad_norm_(const FSDPModule& model, double max_norm, double norm_type = 2.0,
                       bool error_if_nonfinite = false);
double total_grad_norm(const FSDPModule& model, double norm_type = 2.0);

}  // namespace fsdp
