// How the ranks of a collective operation learn each other's outcome, so that a failure on one
// rank fails every rank with the same error (instead of leaving the others waiting in a
// collective the failed rank never reaches), and an operation changes nothing unless every rank
// is ready. Checkpoints, Hugging Face directories and state dicts run each phase that can fail
// on one rank (checking, reading, writing) through agree_on.
//
//   fsdp::agree_on<fsdp::CheckpointError>(*pg, "load_checkpoint " + dir, [&] { staged = read(); });
//   apply(staged);  // every rank read everything
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"
#include "fsdp/errors.h"

namespace fsdp {

// Collective: every rank's string, in rank order (two all-gathers: the lengths, then the padded
// bytes).
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& mine);

// Collective: runs `fn` on this rank (catching what it throws), then every rank learns every
// rank's outcome. Returns "" when every rank's `fn` returned, else the same text on every rank:
// "<what>: rank r: <r's message>; rank s: <s's message>". `fn` must run no collective of `pg`
// (a rank that failed earlier would never join it).
std::string agreed_failures(ProcessGroup& pg, const std::string& what,
                            const std::function<void()>& fn);

// The same, throwing `E` (the caller's documented error: CheckpointError, InvalidArgument, ...)
// with that text on every rank when any rank's `fn` threw.
template <typename E>
void agree_on(ProcessGroup& pg, const std::string& what, const std::function<void()>& fn) {
  const std::string failures = agreed_failures(pg, what, fn);
  if (!failures.empty()) throw E(failures);
}

}  // namespace fsdp
