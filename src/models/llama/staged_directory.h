// Internal to the exports that write a new directory (save_hf_checkpoint, save_peft_adapter):
// the directory is written as a staging sibling `<dir>.tmp-<pid>-<n>` and published atomically
// (io::publish), or removed; nothing a user saved is overwritten.
#pragma once

#include <c10/core/ScalarType.h>

#include <functional>
#include <string>

namespace fsdp::models::llama::detail {

// CheckpointError unless `t` is float32, bfloat16 or float16 (what the files may hold).
void check_export_dtype(c10::ScalarType t);

// CheckpointError when `dir` exists and is not an empty directory.
void check_new_directory(const std::string& dir);

// Rank 0, last in the first agreement (a later failure there would leave it behind): makes
// `dir`'s parent and a fresh staging sibling, whose path it returns.
std::string make_staging_directory(const std::string& dir);

// After a failed collective: removes `staged` (nothing when empty), its own errors swallowed
// (the collective's is the one to report).
void discard_staged(const std::string& staged) noexcept;

// Runs `write` (which fills `staged`), then publishes `staged` as `dir`. On any error removes
// `staged` and throws CheckpointError with the cause (and the removal's, if that failed too).
void publish_staged(const std::string& staged, const std::string& dir,
                    const std::function<void()>& write);

}  // namespace fsdp::models::llama::detail
