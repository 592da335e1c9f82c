// Training data for MiniLLM. Every step's global batch is a pure function of (seed, step), so
// a run at any world size sees the same sequences; rank r of N takes the r-th slice.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data.h"  // trainer/data.h

namespace minillm {

using trainer::Batch;
using trainer::Dataset;

// A file read as bytes (tokens 0..255). Sequence i of step s starts at an offset drawn from
// (seed, s, i) alone.
std::unique_ptr<Dataset> make_text_dataset(const std::string& path, int64_t seq, uint64_t seed);

// A learnable synthetic task: each sequence counts upward modulo `vocab` with a stride in
// 1..7 drawn per sequence; the model must infer the stride from context.
std::unique_ptr<Dataset> make_synthetic_dataset(int64_t vocab, int64_t seq, uint64_t seed);

}  // namespace minillm
