// Memory-mapped token files (token_file.h).
#include "fsdp/data/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "fsdp/errors.h"
#include "util/check.h"

namespace fsdp::data {

// The ids are read as they lie in the file: little-endian, like the machines this builds for.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "token files are little-endian");

TokenDtype parse_token_dtype(const std::string& name) {
  if (name == "uint16") return TokenDtype::kUInt16;
  if (name == "uint32") return TokenDtype::kUInt32;
  throw InvalidArgument(fmt::format("token dtype \"{}\": expected uint16 or uint32", name));
}

const char* token_dtype_name(TokenDtype dtype) {
  return dtype == TokenDtype::kUInt16 ? "uint16" : "uint32";
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t draw(uint64_t seed, uint64_t step, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ step) ^ index);
}

Share share(int64_t total, int rank, int world) {
  FSDP_CHECK_ARG(world >= 1 && 0 <= rank && rank < world && total >= 0,
                 "share: rank {} of a world of {} over {} items", rank, world, total);
  return {rank * total / world, (rank + 1) * total / world - rank * total / world};
}

namespace detail {

struct TokenMapping {
  std::string path;
  int fd = -1;
  const unsigned char* data = nullptr;
  size_t bytes = 0;
  int64_t tokens = 0;
  int item = 2;
  // The loss mask: one byte per token (null without).
  int mask_fd = -1;
  const unsigned char* mask = nullptr;

  ~TokenMapping() {
    if (data) munmap(const_cast<unsigned char*>(data), bytes);
    if (fd >= 0) close(fd);
    if (mask) munmap(const_cast<unsigned char*>(mask), static_cast<size_t>(tokens));
    if (mask_fd >= 0) close(mask_fd);
  }
  int64_t at(int64_t i) const {
    return item == 2 ? reinterpret_cast<const uint16_t*>(data)[i]
                     : reinterpret_cast<const uint32_t*>(data)[i];
  }
  [[noreturn]] void bad_id(int64_t index, int64_t id, int64_t vocab) const {
    throw FormatError(fmt::format(
        "token file {}: token id {} at token index {} (byte offset {}) is not below the "
        "vocabulary size {} (wrong tokenizer or token dtype?)",
        path, id, index, index * item, vocab));
  }
};

}  // namespace detail

namespace {

// The largest id of [begin, end): a plain loop the compiler vectorises (-O3).
template <typename T>
int64_t max_id(const T* p, int64_t begin, int64_t end) {
  T m = 0;
  for (int64_t i = begin; i < end; ++i) m = std::max(m, p[i]);
  return m;
}

}  // namespace

TokenFile::TokenFile(const std::string& path, const TokenFileOptions& options)
    : map_(std::make_unique<detail::TokenMapping>()), options_(options) {
  FSDP_CHECK_ARG(options.vocab > 0, "token file {}: the vocabulary size is {}, expected > 0", path,
                 options.vocab);
  FSDP_CHECK_ARG(options.seq > 0, "token file {}: seq is {}, expected > 0", path, options.seq);
  FSDP_CHECK_ARG(options.dtype == TokenDtype::kUInt32 || options.vocab <= 65536,
                 "token file {}: a vocabulary of {} ids does not fit uint16 tokens (use uint32)",
                 path, options.vocab);
  auto& m = *map_;
  m.path = path;
  m.item = options.dtype == TokenDtype::kUInt16 ? 2 : 4;
  m.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK_ARG(m.fd >= 0, "cannot open the token file {}: {}", path, std::strerror(errno));
  struct stat st {};
  FSDP_CHECK_ARG(fstat(m.fd, &st) == 0 && S_ISREG(st.st_mode),
                 "token file {} is not a regular file", path);
  const auto size = static_cast<size_t>(st.st_size);
  if (size % m.item != 0) {
    throw FormatError(
        fmt::format("token file {}: {} bytes is not a whole number of {} tokens of "
                    "{} bytes (wrong token dtype?)",
                    path, size, token_dtype_name(options.dtype), m.item));
  }
  if (size == 0) throw FormatError(fmt::format("token file {} is empty", path));
  m.tokens = static_cast<int64_t>(size / m.item);
  FSDP_CHECK_ARG(m.tokens > options.seq,
                 "token file {} holds {} tokens; a sequence of seq {} needs at least {}", path,
                 m.tokens, options.seq, options.seq + 1);
  void* p = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, m.fd, 0);
  FSDP_CHECK_ARG(p != MAP_FAILED, "cannot map the token file {}: {}", path, std::strerror(errno));
  m.data = static_cast<const unsigned char*>(p);
  m.bytes = size;
  if (!options.loss_mask.empty()) map_mask(options);
  if (!options.scan_at_open) return;
  // Chunks of 1M tokens (2 or 4 MiB: page-aligned), read sequentially and then dropped from this
  // process's resident set (the file stays in the page cache for the kernel to manage).
  madvise(p, size, MADV_SEQUENTIAL);
  constexpr int64_t kChunk = 1 << 20;
  for (int64_t begin = 0; begin < m.tokens; begin += kChunk) {
    const int64_t end = std::min(m.tokens, begin + kChunk);
    const int64_t top = m.item == 2 ? max_id(reinterpret_cast<const uint16_t*>(m.data), begin, end)
                                    : max_id(reinterpret_cast<const uint32_t*>(m.data), begin, end);
    if (top >= options.vocab) {
      for (int64_t i = begin; i < end; ++i) {
        if (m.at(i) >= options.vocab) m.bad_id(i, m.at(i), options.vocab);
      }
    }
    madvise(const_cast<unsigned char*>(m.data) + begin * m.item,
            static_cast<size_t>((end - begin) * m.item), MADV_DONTNEED);
  }
  madvise(p, size, MADV_RANDOM);  // batches read scattered windows
}

void TokenFile::map_mask(const TokenFileOptions& options) {
  auto& m = *map_;
  const std::string& path = options.loss_mask;
  m.mask_fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  FSDP_CHECK_ARG(m.mask_fd >= 0, "cannot open the loss mask {}: {}", path, std::strerror(errno));
  struct stat st {};
  FSDP_CHECK_ARG(fstat(m.mask_fd, &st) == 0 && S_ISREG(st.st_mode),
                 "loss mask {} is not a regular file", path);
  if (static_cast<int64_t>(st.st_size) != m.tokens) {
    throw FormatError(fmt::format(
        "loss mask {}: {} bytes, but the token file {} holds {} tokens; one byte per token "
        "expected (the two files of one scripts/tokenize_chat.py run)",
        path, static_cast<int64_t>(st.st_size), m.path, m.tokens));
  }
  void* p = mmap(nullptr, static_cast<size_t>(m.tokens), PROT_READ, MAP_PRIVATE, m.mask_fd, 0);
  FSDP_CHECK_ARG(p != MAP_FAILED, "cannot map the loss mask {}: {}", path, std::strerror(errno));
  m.mask = static_cast<const unsigned char*>(p);
  if (!options.scan_at_open) return;
  int64_t counted = 0;
  for (int64_t i = 0; i < m.tokens; ++i) {
    if (m.mask[i] > 1) {
      throw FormatError(fmt::format("loss mask {}: byte {} is {}; expected 0 or 1", path, i,
                                    static_cast<int>(m.mask[i])));
    }
    counted += m.mask[i];
  }
  if (counted == 0) {
    throw FormatError(fmt::format("loss mask {}: no token counts (every byte is 0)", path));
  }
}

TokenFile::~TokenFile() = default;
TokenFile::TokenFile(TokenFile&&) noexcept = default;
TokenFile& TokenFile::operator=(TokenFile&&) noexcept = default;

const std::string& TokenFile::path() const { return map_->path; }
int64_t TokenFile::size() const { return map_->tokens; }
int64_t TokenFile::seq() const { return options_.seq; }

int64_t TokenFile::token(int64_t index) const {
  FSDP_CHECK_ARG(0 <= index && index < map_->tokens, "token file {}: index {} of {} tokens",
                 map_->path, index, map_->tokens);
  return map_->at(index);
}

namespace {

// Rows of seq + 1 tokens starting at starts[i], split into inputs and targets; every id checked.
template <typename StartOf>
TokenBatch windows(const detail::TokenMapping& m, int64_t vocab, int64_t seq, int64_t count,
                   StartOf start_of) {
  auto rows = torch::empty({count, seq + 1}, torch::kLong);
  auto* out = rows.data_ptr<int64_t>();
  auto targets = torch::empty({count, seq}, torch::kLong);
  auto* t = targets.data_ptr<int64_t>();
  for (int64_t r = 0; r < count; ++r) {
    const int64_t start = start_of(r);
    for (int64_t j = 0; j <= seq; ++j) {
      const int64_t id = m.at(start + j);
      if (id >= vocab) m.bad_id(start + j, id, vocab);
      out[r * (seq + 1) + j] = id;
      // The target of position j - 1; not counted where the mask says so.
      if (j > 0) t[r * seq + j - 1] = m.mask && m.mask[start + j] == 0 ? -100 : id;
    }
  }
  return {rows.narrow(1, 0, seq).contiguous(), targets};
}

}  // namespace

TokenBatch TokenFile::batch(int64_t step, int64_t first, int64_t count) const {
  FSDP_CHECK_ARG(step >= 0 && first >= 0 && count >= 0,
                 "token file {}: batch(step {}, first {}, count {}): expected non-negative values",
                 map_->path, step, first, count);
  const auto starts = static_cast<uint64_t>(map_->tokens - options_.seq);
  return windows(*map_, options_.vocab, options_.seq, count, [&](int64_t r) {
    return static_cast<int64_t>(
        draw(options_.seed, static_cast<uint64_t>(step), static_cast<uint64_t>(first + r)) %
        starts);
  });
}

TokenBatch TokenFile::rank_batch(int64_t step, int64_t global_batch, int rank, int world) const {
  const auto s = share(global_batch, rank, world);
  return batch(step, s.first, s.count);
}

int64_t TokenFile::val_window_count() const { return (map_->tokens - 1) / options_.seq; }

TokenBatch TokenFile::val_batch(int64_t first, int64_t count) const {
  FSDP_CHECK_ARG(first >= 0 && count >= 0 && first + count <= val_window_count(),
                 "token file {}: validation windows [{}, {}) of {}", map_->path, first,
                 first + count, val_window_count());
  return windows(*map_, options_.vocab, options_.seq, count,
                 [&](int64_t r) { return (first + r) * options_.seq; });
}

Share TokenFile::val_windows(int rank, int world) const {
  return share(val_window_count(), rank, world);
}

}  // namespace fsdp::data
