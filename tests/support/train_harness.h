// Training runs for equivalence tests: the same model, seed and global batch trained once in
// a single process without FSDP (the reference) and once sharded over a process group, each
// rank training on its slice of every global batch.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/fsdp.h"
#include "fsdp/models/minillm.h"
#include "support/torch_api.h"

namespace fsdp::testing {

// Relative loss error and per-tensor normalised parameter error (max |a - b| / max |b|) that the
// fp32 equivalence tests allow after 10 AdamW steps: the reference accumulates the gradients of
// the N slices of each global batch in one process, so only the order of float additions may
// differ.
inline constexpr double kFp32Tolerance = 1e-5;

// MiniLLM at sizes that divide by nothing: vocab 1001, dim 60, a head of 3 outputs.
using TinyLM = fsdp::models::minillm::MiniLLM;
inline fsdp::models::minillm::Config tiny_config() {
  fsdp::models::minillm::Config c;
  c.vocab = 1001;
  c.dim = 60;
  c.layers = 2;
  c.heads = 4;
  c.outputs = 3;
  return c;
}

struct TrainSpec {
  fsdp::models::minillm::Config model = tiny_config();
  int steps = 10;
  int64_t batch = 12;  // global: divides by 1, 2, 3 and 4
  int64_t seq = 5;
  double lr = 1e-2;
  uint64_t seed = 1234;
  MixedPrecisionPolicy mp;
  std::optional<bool> reshard_after_forward;
  // Micro-batches per step on each rank (gradient accumulation); the rank's slice splits
  // evenly. Gradient sync is off for all but the last, unless sync_every_micro_batch.
  int micro_batches = 1;
  bool sync_every_micro_batch = false;
  // Activation checkpointing of the blocks, and of the root (which then recomputes the
  // checkpointed blocks inside its own recompute).
  bool checkpoint_blocks = false;
  bool checkpoint_root = false;
  // Every unit's shards in host memory (FullyShardOptions::offload_policy).
  std::optional<CPUOffloadPolicy> offload;
  // Applied to the freshly built model, before sharding (e.g. freezing parameters).
  std::function<void(TinyLM&)> edit_model;
  // Where the model trains: parameters are initialised on the CPU (the same values on every
  // device), then moved.
  c10::Device device{c10::kCPU};
};

struct TrainResult {
  std::vector<double> losses;                              // global mean loss per step
  std::vector<std::pair<std::string, at::Tensor>> params;  // full fp32 parameters at the end
};

// The same initial parameters on every thread and process for a given seed.
TinyLM build_model(const TrainSpec& spec);
// The same model sharded block by block as it is built (MiniLLMImpl::BlockBuilt), then the
// root: start-up without the full model. `model` receives the module.
Unit<TinyLM> build_sharded_by_block(const TrainSpec& spec, const ProcessGroupPtr& pg,
                                    TinyLM& model);

// Runs that change the order of float additions (accumulation) cannot match bit for bit. The
// attention's key bias has a gradient that is zero up to rounding (softmax ignores a shift of
// every score), and AdamW normalises that rounding noise into lr-sized steps of either sign;
// freezing the packed in-projection bias keeps such comparisons about what they test.
inline void freeze_attention_bias(TinyLM& model) {
  for (auto& layer : model->layers) layer->attn->in_proj_bias.set_requires_grad(false);
}

// Rows [rank * per_rank, (rank + 1) * per_rank) of a global batch: this rank's slice.
inline at::Tensor rank_slice(const at::Tensor& batch, const ProcessGroupPtr& pg, int64_t per_rank) {
  return batch.narrow(0, pg->rank() * per_rank, per_rank);
}

// Thread-rank options for tests: a hang fails the test after a minute instead of stalling CI.
LocalGroupOptions test_options();

// Bytes of `rank`'s shards of every parameter of `model` (fp32, before sharding) in a world of
// `world` ranks: what MemoryStats::sharded_param_bytes must report.
int64_t expected_shard_bytes(TinyLM& model, int world, int rank);
// Global batch of `step`: tokens [batch, seq] and class targets [batch, seq].
std::pair<at::Tensor, at::Tensor> global_batch(const TrainSpec& spec, int step);

// Shards every block of `model`, then the root, as a training program does.
Unit<TinyLM> shard_model(TinyLM& model, const ProcessGroupPtr& pg,
                         const FullyShardOptions& options = {});
// The same with spec's options (mixed precision, resharding, checkpointing).
Unit<TinyLM> shard_model(TinyLM& model, const ProcessGroupPtr& pg, const TrainSpec& spec);
// Hybrid sharding over `mesh` (device_mesh.h).
Unit<TinyLM> shard_model(TinyLM& model, const DeviceMesh& mesh, const TrainSpec& spec);

// Single process, no FSDP: each step runs forward/backward on `slices` equal slices of the
// global batch and steps AdamW on the average of their gradients, the order of operations
// data parallelism uses (slices = 1 is plain full-batch training). With spec.mp.param_dtype
// set it applies FSDP's casts by hand: an fp32 master copy steps AdamW, a compute copy in
// param_dtype runs forward and backward, gradients are averaged in fp32.
TrainResult train_reference(const TrainSpec& spec, int slices);

// This rank's part of a sharded run over `pg` (every rank must call it): each step, the
// rank's slice of the global batch in spec.micro_batches micro-batches, losses scaled by 1 /
// micro_batches.
TrainResult train_sharded(const TrainSpec& spec, const ProcessGroupPtr& pg);
// The same over a hybrid mesh: each rank of mesh.world trains on its slice; parameters are
// gathered within mesh.shard at the end.
TrainResult train_sharded(const TrainSpec& spec, const DeviceMesh& mesh);

// max |a - b| / max(|b|, 1e-12) over all elements of matching parameters, and of losses.
double max_rel_param_error(const TrainResult& got, const TrainResult& want);
double max_rel_loss_error(const TrainResult& got, const TrainResult& want);

// Cross entropy of [.., classes] logits against [..] targets.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& targets, int64_t classes);

// Prints both errors (labelled, with the world size) and expects each below `tolerance`.
void expect_parity(const std::string& label, int world, const TrainResult& got,
                   const TrainResult& want, double tolerance);

// The full tensor of a parameter sharded by fully_shard (rows of every rank), from its shard.
at::Tensor gather_full(const ProcessGroupPtr& pg, const at::Tensor& shard, int64_t full_dim0);

}  // namespace fsdp::testing
