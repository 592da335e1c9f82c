// Internal: one rank's data file of a checkpoint, written sequentially and read by ranges.
// Every chunk of rows carries a CRC-32 (in the manifest), so a reader verifies exactly what it
// reads and reads only the chunks that overlap the rows it needs.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "checkpoint/manifest.h"
#include "fsdp/io/files.h"

namespace fsdp::detail {

// About this many bytes per checksummed chunk (at least one row).
inline constexpr int64_t kChunkBytes = 4 << 20;

class RankFileWriter {
 public:
  // Creates (truncates) dir/file. IoError when it cannot.
  RankFileWriter(const std::string& dir, const std::string& file);

  // Appends `rows` (rows [row_begin, row_begin + rows.size(0)) of a tensor of `shape`; any
  // device, copied to a contiguous CPU tensor) and returns where they went.
  StoredRows append(const at::Tensor& rows, int64_t row_begin, const std::vector<int64_t>& shape);
  // Flushes to the disk (fsync) and closes; IoError naming the file on failure.
  void finish();

 private:
  io::FileWriter out_;
  std::string file_;
};

// Reads rows [begin, end) of `t` from the checkpoint in `dir` into `dst` (a contiguous CPU
// tensor of end - begin rows), verifying every chunk read. CheckpointError naming the file
// and the tensor for a missing or truncated file, a checksum mismatch, or rows no rank stored.
void read_rows(const std::string& dir, const StoredTensor& t, int64_t begin, int64_t end,
               const at::Tensor& dst);

}  // namespace fsdp::detail
