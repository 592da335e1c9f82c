// Tokenized training data in nanoGPT's raw format (what scripts/tokenize_text.py writes): token ids
// one after another, little-endian uint16 (uint32 for vocabularies above 65536 ids), no header.
// The file is memory-mapped and never read whole: a batch touches only its windows' pages.
//
// The batch rule (shared with examples/minillm/data.cpp and tests/reference/hf_llama.py):
//   draw(seed, step, index) = mix(mix(mix(seed) ^ step) ^ index), mix = splitmix64's finaliser
//   sequence i of step s (i in 0..B-1, the global batch): start = draw(seed, s, i) % (n - seq),
//   inputs tokens[start, start + seq), targets tokens[start + 1, start + seq + 1)
//   rank r of W takes sequences [r*B/W, (r+1)*B/W) (share())
// Validation windows: window i is tokens[i*seq, i*seq + seq + 1) (inputs the first seq,
// targets the last seq), i = 0 .. (n-1)/seq - 1; rank r takes its contiguous share().
//
// Token ids are checked against the vocabulary twice, so that a bad id never reaches the
// embedding (where it would be an index error on the CPU and a device-side assert on a GPU):
// - at open, a scan of the whole file (on by default): the failure comes before training, not
//   hours into it. Cost: one sequential read of the file and a compiler-vectorised max per
//   1M-token chunk, the speed of reading the file: 1e9 uint16 tokens (2 GB) took 0.37 s from the
//   page cache and 3.5 s from disk on a busy 2-core development machine. Each chunk is then
//   dropped from the process's resident set (MADV_DONTNEED: clean, file-backed pages).
// - in every batch, the ids copied are compared again (B x seq comparisons, nothing next to a
//   forward), which also covers a file changed under the mapping after the scan.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace fsdp::data {

namespace detail {
struct TokenMapping;  // the mapped file (token_file.cpp)
}  // namespace detail

enum class TokenDtype { kUInt16, kUInt32 };
// "uint16" / "uint32" (InvalidArgument otherwise), and back.
TokenDtype parse_token_dtype(const std::string& name);
const char* token_dtype_name(TokenDtype dtype);

// splitmix64's finaliser and the nested draw of the batch rule above.
uint64_t splitmix64(uint64_t x);
uint64_t draw(uint64_t seed, uint64_t step, uint64_t index);

// Rows [first, first + count) of `total` given to rank `rank` of `world`: [r*T/W, (r+1)*T/W).
struct Share {
  int64_t first = 0, count = 0;
};
Share share(int64_t total, int rank, int world);

struct TokenBatch {
  torch::Tensor inputs;   // [count, seq] int64
  torch::Tensor targets;  // [count, seq] int64: the inputs shifted by one token
};

struct TokenFileOptions {
  TokenDtype dtype = TokenDtype::kUInt16;
  int64_t vocab = 0;  // every id must be below it (required)
  int64_t seq = 0;    // tokens per sequence (required)
  uint64_t seed = 0;  // of the batch draws
  bool scan_at_open = true;
  // A loss mask (scripts/tokenize_chat.py's): one byte per token, 1 where the token counts as a
  // target, 0 where not (a chat's prompt and template tokens). Batches then hold -100 (the
  // ignore index of cross_entropy and of transformers' labels) as the target where the mask is
  // 0. Empty: every target counts.
  std::string loss_mask;
};

class TokenFile {
 public:
  // Maps `path`. Throws FormatError naming the file when its size is not a whole number of
  // tokens (the size and the dtype named), when it is empty, or (scan_at_open) when an id is
  // >= vocab: the id, its token index and its byte offset; InvalidArgument when it cannot be
  // opened, for a vocab or seq that is not positive, a vocab the dtype cannot hold ids of, or
  // a file of n <= seq tokens (no sequence of seq + 1 tokens fits).
  // With options.loss_mask: FormatError naming both files when the mask's size is not one byte
  // per token, or (scan_at_open) a byte other than 0 and 1, with its index.
  TokenFile(const std::string& path, const TokenFileOptions& options);
  ~TokenFile();
  TokenFile(TokenFile&&) noexcept;
  TokenFile& operator=(TokenFile&&) noexcept;

  const std::string& path() const;
  int64_t size() const;  // tokens
  int64_t seq() const;
  int64_t token(int64_t index) const;

  // Sequences [first, first + count) of step `step`'s global batch. FormatError as at open
  // when a copied id is >= vocab.
  TokenBatch batch(int64_t step, int64_t first, int64_t count) const;
  // Rank `rank`'s share of a global batch of `global_batch` sequences.
  TokenBatch rank_batch(int64_t step, int64_t global_batch, int rank, int world) const;

  // (n - 1) / seq validation windows.
  int64_t val_window_count() const;
  // Windows [first, first + count).
  TokenBatch val_batch(int64_t first, int64_t count) const;
  // Rank `rank`'s contiguous share of the windows: share(val_window_count(), rank, world).
  Share val_windows(int rank, int world) const;

 private:
  void map_mask(const TokenFileOptions& options);
  std::unique_ptr<detail::TokenMapping> map_;
  TokenFileOptions options_;
};

}  // namespace fsdp::data
