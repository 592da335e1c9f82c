// Internal: how the ranks of a checkpoint operation learn each other's outcome, so that a
// failure on one rank fails every rank (instead of leaving the others waiting in a collective)
// and a load changes nothing unless every rank is ready.
#pragma once

#include <string>
#include <vector>

#include "fsdp/comm/process_group.h"

namespace fsdp::detail {

// Every rank's string, in rank order (two all-gathers: the lengths, then the padded bytes).
std::vector<std::string> all_gather_strings(ProcessGroup& pg, const std::string& mine);

// The message of the exception being handled (call inside a catch block).
std::string current_exception_message();

// Collective: throws CheckpointError on every rank when any rank's `error` is not empty; the
// message is "<what>: rank r: <error>" for each failed rank.
void agree_or_throw(ProcessGroup& pg, const std::string& what, const std::string& error);

}  // namespace fsdp::detail
