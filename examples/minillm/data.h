// Training data for MiniLLM. Every step's global batch is a pure function of (seed, step), so
// a run at any world size sees the same sequences; rank r of N takes the r-th slice.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace minillm {

struct Batch {
  torch::Tensor tokens;   // [batch, seq] int64
  torch::Tensor targets;  // [batch, seq] int64: tokens shifted by one
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Sequences [first, first + count) of the global batch of `step`.
  virtual Batch slice(int step, int64_t first, int64_t count) const = 0;
  virtual std::string describe() const = 0;
};

// A file read as bytes (tokens 0..255). Sequence i of step s starts at an offset drawn from
// (seed, s, i) alone.
std::unique_ptr<Dataset> make_text_dataset(const std::string& path, int64_t seq, uint64_t seed);

// A learnable synthetic task: each sequence counts upward modulo `vocab` with a stride in
// 1..7 drawn per sequence; the model must infer the stride from context.
std::unique_ptr<Dataset> make_synthetic_dataset(int64_t vocab, int64_t seq, uint64_t seed);

}  // namespace minillm
