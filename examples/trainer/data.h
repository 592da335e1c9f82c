// What a trainer trains on: every step's global batch a pure function of (seed, step), so any
// world size sees the same sequences (rank r of N takes the r-th slice), and validation
// windows split over the ranks.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace trainer {

struct Batch {
  torch::Tensor tokens;   // [sequences, seq] int64
  torch::Tensor targets;  // [sequences, seq] int64: tokens shifted by one
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // Sequences [first, first + count) of the global batch of `step`.
  virtual Batch slice(int step, int64_t first, int64_t count) const = 0;
  virtual std::string describe() const = 0;
};

// Validation: windows of seq + 1 tokens, the loss the mean next-token cross-entropy over all
// their predictions.
class Windows {
 public:
  virtual ~Windows() = default;
  virtual int64_t count() const = 0;
  // Windows [first, first + n) as inputs and targets.
  virtual Batch windows(int64_t first, int64_t n) const = 0;
  virtual std::string describe() const = 0;
};

}  // namespace trainer
