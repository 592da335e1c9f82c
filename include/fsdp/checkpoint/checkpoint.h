// Sharded checkpoints: every rank writes its own parameter and optimizer-state shards in
// parallel, rank 0 a manifest; a checkpoint loads at any world size (PyTorch's
// torch.distributed.checkpoint, for C++ programs).
//
// On disk, `dir/step_<step>/`:
//   manifest.json     format and library version, world size, step, user metadata, the
//                     optimizer kind, and for every tensor its global shape, dtype and each
//                     rank's rows: file, byte offset, size and CRC-32s of chunks of rows
//                     (about 4 MiB each); and a CRC-32 of the manifest itself
//   rank_00000.bin    rank 0's rows of every tensor (rank r: rank_<r as five digits>.bin), raw
//                     little-endian, one after another
// Tensors: the model's state dict and the optimizer's (state_dict.h): each parameter under its
// name in the model (the first name of a tied tensor), buffers, and the optimizer's state as
// "<name>#<state>" ("#exp_avg", "#momentum_buffer", "#square_avg", "#sum", ...: sharded like the
// parameter; "#step": a scalar), its kind ("#optimizer") and its param groups' options
// ("#param_groups.<i>"). Replicated tensors are written once, by rank 0; with hybrid sharding
// only replica 0 writes rows.
//
// Atomic: the ranks write into `dir/.tmp-step_<step>/`, fsync every file, rank 0 writes the
// manifest last, fsyncs, and renames the directory into place (then fsyncs `dir`). A crash at
// any point leaves earlier checkpoints as they were and at most a .tmp-step_<step> directory,
// which latest_checkpoint ignores and the next save removes. Only the names this library writes
// count: `step_` and 10 to 19 digits, and `.tmp-step_<digits>` and `.tmp-removing-step_<digits>`
// (a save's or a removal's leftovers); anything else in `dir` (a user's "step_2_best" or
// "step_5", a ".tmp-notes") is neither read nor removed.
//
// Collective: every rank of `pg` calls these with the same arguments. A failure on any rank
// (a file that cannot be written or read, a checksum or shape that does not match) is reported
// on every rank as CheckpointError naming the rank, the file and the tensor; load changes no
// parameter and no optimizer state unless every rank read and verified everything it needs.
#pragma once

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "fsdp/comm/process_group.h"
#include "fsdp/errors.h"
#include "fsdp/parallel/tensor_parallel.h"

namespace fsdp {

// CheckpointError (a checkpoint could not be written or read; the message names the rank, file
// and tensor) is declared in fsdp/errors.h.

struct SaveOptions {
  // Keep this many complete checkpoints in the directory (0: keep all): the one saved and the
  // newest of the earlier steps. A checkpoint of a later step than the one saved (another
  // run's, or the rest of a run resumed from an earlier step) is never removed. A removed
  // checkpoint is renamed aside first, so a crash while removing leaves it whole or gone.
  int keep_last = 0;
  // Stored in the manifest and returned by load_checkpoint (data position, run name, ...).
  std::map<std::string, std::string> metadata;
  // Tensor parallelism (fsdp/parallel/tensor_parallel.h): the model's parameters (and their
  // optimizer state) are slices; the checkpoint holds the full tensors as rows, as without
  // tensor parallelism, so that it loads at any data-parallel and tensor-parallel degree. A
  // slice of columns is gathered over the TP group row by row (each rank's shard rows whole);
  // tensors equal on every TP rank are written by TP rank 0 only.
  tp::Layout tp;
  // Which of the model's tensors to write, by state-dict name (their optimizer state goes with
  // them); empty: all. A LoRA run writes its adapters alone (fsdp::models::is_lora_parameter):
  // the frozen weights are the base model's, read again from where they came, and a checkpoint
  // is the adapters' size. The manifest marks such a checkpoint partial. Every parameter the
  // optimizer updates (one of its parameters that requires grad) must pass, or its value and
  // state would be lost: InvalidArgument before anything is written.
  std::function<bool(const std::string& name)> filter;
};

struct LoadOptions {
  // The model's tensor-parallel layout now (as SaveOptions::tp); empty: none. Any checkpoint
  // of the same model loads, whatever the layout that saved it.
  tp::Layout tp;
  // Which of the model's tensors to load, by state-dict name; empty: all. The others keep their
  // values and their optimizer state, and stored tensors it excludes (with their optimizer state)
  // are skipped, so that the adapters of a full checkpoint load alone too. A partial checkpoint
  // (SaveOptions::filter) needs a filter that excludes what it does not hold.
  std::function<bool(const std::string& name)> filter;
};

struct CheckpointInfo {
  std::string path;  // the checkpoint's directory
  int64_t step = 0;
  int world_size = 0;  // the world size that saved it
  std::map<std::string, std::string> metadata;
  bool partial = false;  // saved with SaveOptions::filter: part of the model's tensors
};

// Saves `model` (sharded by fully_shard or not; parameters must be sharded, not gathered) and,
// when given, `optimizer`'s state into dir/step_<step>. Returns the checkpoint's path. The
// optimizer must be one whose state can be sharded (state_dict.h: Adam, AdamW, FusedAdamW,
// SGD, RMSprop, Adagrad), over parameters of `model`; anything else is an error before
// anything is written. A checkpoint of the same
// step already in `dir` is an error: nothing a user saved is overwritten.
std::string save_checkpoint(const std::string& dir, int64_t step, const torch::nn::Module& model,
                            const torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg,
                            const SaveOptions& options = {});

// The complete checkpoint of `dir` with the highest step (one with its manifest in place), or
// nullopt when there is none (or no `dir`). CheckpointError when a step directory of a higher
// step has no manifest: no save leaves one, so it was damaged, and resuming from an older
// checkpoint instead would silently train those steps again. Local: no communication.
std::optional<std::string> latest_checkpoint(const std::string& dir);

// Loads a checkpoint saved at any world size into `model`, sharded the way it is now (each rank
// reads only the chunks of rows it needs), and `optimizer`'s state (with its param groups'
// options) when given: the same kind of optimizer, with as many param groups. Names, shapes and
// dtypes must match both ways; the manifest's checksum and, for a directory named
// step_<digits>, its step must match too.
CheckpointInfo load_checkpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg);
CheckpointInfo load_checkpoint(const std::string& path, torch::nn::Module& model,
                               torch::optim::Optimizer* optimizer, const ProcessGroupPtr& pg,
                               const LoadOptions& options);

}  // namespace fsdp
