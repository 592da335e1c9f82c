#include "checkpoint/rank_file.h"

#include <caffe2/serialize/crc_alt.h>  // libtorch's CRC-32 (the one its own archives use)
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "fsdp/errors.h"

namespace fsdp::detail {

uint32_t checksum(std::string_view bytes) { return crc32_fast(bytes.data(), bytes.size()); }

RankFileWriter::RankFileWriter(const std::string& dir, const std::string& file)
    : out_(dir + "/" + file), file_(file) {}

StoredRows RankFileWriter::append(const at::Tensor& rows, int64_t row_begin,
                                  const std::vector<int64_t>& shape) {
  auto host = rows.detach().to(at::kCPU).contiguous();
  const int64_t rb = row_bytes(shape, host.scalar_type());
  const int64_t n = host.dim() == 0 ? 1 : host.size(0);
  StoredRows s;
  s.file = file_;
  s.row_begin = row_begin;
  s.row_end = row_begin + n;
  s.offset = out_.offset();
  s.nbytes = n * rb;
  s.chunk_rows = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(rb, 1));
  const char* data = static_cast<const char*>(host.data_ptr());
  for (int64_t row = 0; row < n; row += s.chunk_rows) {
    const int64_t bytes = std::min(s.chunk_rows, n - row) * rb;
    s.crc32.push_back(crc32_fast(data + row * rb, static_cast<size_t>(bytes)));
  }
  out_.write(data, static_cast<size_t>(s.nbytes));
  return s;
}

void RankFileWriter::finish() { out_.close(); }

void read_rows(const std::string& dir, const StoredTensor& t, int64_t begin, int64_t end,
               const at::Tensor& dst) {
  const int64_t rb = row_bytes(t.shape, t.dtype);
  char* out = static_cast<char*>(dst.data_ptr());
  int64_t covered = 0;
  std::unique_ptr<char[]> scratch;  // for chunks that reach beyond the rows needed
  int64_t scratch_bytes = 0;
  for (const auto& s : t.rows) {
    const int64_t lo = std::max(begin, s.row_begin), hi = std::min(end, s.row_end);
    if (lo >= hi) continue;
    covered += hi - lo;
    const std::string path = dir + "/" + s.file;
    io::FileReader file(path, fmt::format("tensor '{}'", t.name));
    // The chunks that hold rows [lo, hi), read whole so their checksums can be verified.
    const int64_t c0 = (lo - s.row_begin) / s.chunk_rows;
    const int64_t c1 = (hi - 1 - s.row_begin) / s.chunk_rows;
    const int64_t first_row = s.row_begin + c0 * s.chunk_rows;
    const int64_t last_row = std::min(s.row_end, s.row_begin + (c1 + 1) * s.chunk_rows);
    const int64_t nbytes = (last_row - first_row) * rb;
    const int64_t at = s.offset + (first_row - s.row_begin) * rb;
    // Rows that are exactly whole chunks (the same world size, or a multiple of it) are read
    // straight into the destination; others through a scratch buffer.
    const bool direct = first_row == lo && last_row == hi;
    if (!direct && scratch_bytes < nbytes) {
      scratch.reset(new char[static_cast<size_t>(nbytes)]);  // not zero-filled: read over
      scratch_bytes = nbytes;
    }
    char* buffer = direct ? out + (lo - begin) * rb : scratch.get();
    if (!file.read_at(buffer, nbytes, at)) {
      throw CheckpointError(fmt::format("{} is truncated: tensor '{}' needs bytes {}..{} of it",
                                        path, t.name, at, at + nbytes));
    }
    for (int64_t c = c0; c <= c1; ++c) {
      const int64_t row = s.row_begin + c * s.chunk_rows;
      const int64_t bytes = (std::min(s.row_end, row + s.chunk_rows) - row) * rb;
      const char* chunk = buffer + (row - first_row) * rb;
      if (crc32_fast(chunk, static_cast<size_t>(bytes)) != s.crc32[c]) {
        throw CheckpointError(
            fmt::format("{}: checksum mismatch in tensor '{}', rows {}..{} (the file is corrupted)",
                        path, t.name, row, row + bytes / std::max<int64_t>(rb, 1)));
      }
    }
    if (!direct) {
      std::memcpy(out + (lo - begin) * rb, buffer + (lo - first_row) * rb,
                  static_cast<size_t>((hi - lo) * rb));
    }
  }
  if (covered != end - begin) {
    throw CheckpointError(fmt::format(
        "tensor '{}': rows {}..{} are not all stored in {} (stored pieces overlap or miss rows)",
        t.name, begin, end, dir));
  }
}

}  // namespace fsdp::detail
