#include "checkpoint/rank_file.h"

#include <caffe2/serialize/crc_alt.h>  // libtorch's CRC-32 (the one its own archives use)
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "checkpoint/posix_files.h"
#include "fsdp/checkpoint/checkpoint.h"

namespace fsdp::detail {
namespace {

void write_all(int fd, const char* data, int64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, data, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw CheckpointError(fmt::format("cannot write {}: {}", path, os_error()));
    data += w;
    n -= w;
  }
}

// Reads exactly n bytes at `offset`; false when the file ends first.
bool read_all(int fd, char* data, int64_t n, int64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t r = ::pread(fd, data, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw CheckpointError(fmt::format("cannot read {}: {}", path, os_error()));
    if (r == 0) return false;
    data += r;
    n -= r;
    offset += r;
  }
  return true;
}

class ReadFile {
 public:
  ReadFile(const std::string& path, const std::string& tensor) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      throw CheckpointError(
          fmt::format("cannot open {} (tensor '{}'): {}", path, tensor, os_error()));
    }
  }
  ~ReadFile() { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  std::string path_;
  int fd_;
};

}  // namespace

RankFileWriter::RankFileWriter(const std::string& dir, const std::string& file)
    : path_(dir + "/" + file), file_(file) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw CheckpointError(fmt::format("cannot create {}: {}", path_, os_error()));
}

RankFileWriter::~RankFileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

StoredRows RankFileWriter::append(const at::Tensor& rows, int64_t row_begin,
                                  const std::vector<int64_t>& shape) {
  auto host = rows.detach().to(at::kCPU).contiguous();
  const int64_t rb = row_bytes(shape, host.scalar_type());
  const int64_t n = host.dim() == 0 ? 1 : host.size(0);
  StoredRows s;
  s.file = file_;
  s.row_begin = row_begin;
  s.row_end = row_begin + n;
  s.offset = offset_;
  s.nbytes = n * rb;
  s.chunk_rows = std::max<int64_t>(1, kChunkBytes / std::max<int64_t>(rb, 1));
  const char* data = static_cast<const char*>(host.data_ptr());
  for (int64_t row = 0; row < n; row += s.chunk_rows) {
    const int64_t bytes = std::min(s.chunk_rows, n - row) * rb;
    s.crc32.push_back(crc32_fast(data + row * rb, static_cast<size_t>(bytes)));
  }
  write_all(fd_, data, s.nbytes, path_);
  offset_ += s.nbytes;
  return s;
}

void RankFileWriter::finish() {
  if (::fsync(fd_) != 0)
    throw CheckpointError(fmt::format("cannot fsync {}: {}", path_, os_error()));
  if (::close(fd_) != 0)
    throw CheckpointError(fmt::format("cannot close {}: {}", path_, os_error()));
  fd_ = -1;
}

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
    ReadFile file(path, t.name);
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
    if (!read_all(file.fd(), buffer, nbytes, at, path)) {
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

void sync_directory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw CheckpointError(fmt::format("cannot open directory {}: {}", dir, os_error()));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw CheckpointError(fmt::format("cannot fsync directory {}: {}", dir, os_error()));
}

}  // namespace fsdp::detail
