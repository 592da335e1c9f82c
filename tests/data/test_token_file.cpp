// Token files: uint16 and uint32, bad sizes and ids named with their offsets, the batch draw rule
// against a hand computation (and Python's values), and validation windows split over ranks.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "fsdp/data/token_file.h"
#include "fsdp/errors.h"
#include "models/llama_test_util.h"
#include "support/expect_error.h"

namespace fsdp::testing {
namespace {

using fsdp::data::TokenDtype;
using fsdp::data::TokenFile;
using fsdp::data::TokenFileOptions;

template <typename T>
std::string write_tokens(const std::vector<T>& ids) {
  const std::string path = scratch_path("tokens") + ".bin";
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * sizeof(T)));
  return path;
}

std::vector<uint16_t> counting(int n, int vocab) {
  std::vector<uint16_t> ids(n);
  for (int i = 0; i < n; ++i) ids[i] = static_cast<uint16_t>((i * 7 + 3) % vocab);
  return ids;
}

TokenFileOptions options(int64_t vocab, int64_t seq, uint64_t seed = 0,
                         TokenDtype dtype = TokenDtype::kUInt16) {
  TokenFileOptions o;
  o.vocab = vocab;
  o.seq = seq;
  o.seed = seed;
  o.dtype = dtype;
  return o;
}

// splitmix64, written out again here so that the library's copy is checked against it.
uint64_t mix_by_hand(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

TEST(TokenFile, DrawMatchesPythonsReference) {
  // tests/reference/hf_llama.py's draw() printed these.
  EXPECT_EQ(fsdp::data::draw(1234, 3, 5), 461744310552544539ULL);
  EXPECT_EQ(fsdp::data::draw(0, 0, 0), 2558736989570252433ULL);
  EXPECT_EQ(fsdp::data::draw(7, 11, 2), 12533817405398265786ULL);
}

TEST(TokenFile, ReadsUint16AndUint32) {
  auto ids = counting(100, 50);
  auto path = write_tokens(ids);
  TokenFile f(path, options(50, 8));
  EXPECT_EQ(f.size(), 100);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(f.token(i), ids[i]);
  std::remove(path.c_str());

  std::vector<uint32_t> big = {70000, 5, 123456, 99999, 0, 1};
  path = write_tokens(big);
  TokenFile g(path, options(123457, 2, 0, TokenDtype::kUInt32));
  EXPECT_EQ(g.size(), 6);
  EXPECT_EQ(g.token(2), 123456);
  EXPECT_EQ(g.token(0), 70000);
  std::remove(path.c_str());
}

TEST(TokenFile, BatchesFollowTheDrawRule) {
  const int64_t n = 500, seq = 16, vocab = 61;
  const uint64_t seed = 1234;
  auto ids = counting(n, vocab);
  auto path = write_tokens(ids);
  TokenFile f(path, options(vocab, seq, seed));
  for (int64_t step : {0, 1, 17}) {
    auto b = f.batch(step, 3, 5);
    ASSERT_EQ(b.inputs.sizes(), (std::vector<int64_t>{5, seq}));
    ASSERT_EQ(b.inputs.scalar_type(), torch::kLong);
    for (int64_t r = 0; r < 5; ++r) {
      const uint64_t index = 3 + r;
      const uint64_t start =
          mix_by_hand(mix_by_hand(mix_by_hand(seed) ^ static_cast<uint64_t>(step)) ^ index) %
          static_cast<uint64_t>(n - seq);
      for (int64_t j = 0; j < seq; ++j) {
        ASSERT_EQ(b.inputs[r][j].item<int64_t>(), ids[start + j]) << step << " " << r << " " << j;
        ASSERT_EQ(b.targets[r][j].item<int64_t>(), ids[start + j + 1]);
      }
    }
  }
  // Ranks' shares of a global batch, put together, are the global batch.
  const int64_t global = 12;
  auto whole = f.batch(4, 0, global);
  for (int world = 1; world <= 5; ++world) {
    std::vector<torch::Tensor> parts;
    for (int r = 0; r < world; ++r) parts.push_back(f.rank_batch(4, global, r, world).inputs);
    EXPECT_TRUE(torch::equal(torch::cat(parts), whole.inputs)) << "world " << world;
  }
  auto s = fsdp::data::share(12, 2, 4);
  EXPECT_EQ(s.first, 6);
  EXPECT_EQ(s.count, 3);
  std::remove(path.c_str());
}

TEST(TokenFile, ValidationWindowsSplitOverRanksCoverEachOnce) {
  const int64_t n = 203, seq = 10;  // (203 - 1) / 10 = 20 windows
  auto ids = counting(n, 97);
  auto path = write_tokens(ids);
  TokenFile f(path, options(97, seq));
  ASSERT_EQ(f.val_window_count(), 20);
  auto all = f.val_batch(0, 20);
  for (int64_t w = 0; w < 20; ++w) {
    for (int64_t j = 0; j < seq; ++j) {
      ASSERT_EQ(all.inputs[w][j].item<int64_t>(), ids[w * seq + j]);
      ASSERT_EQ(all.targets[w][j].item<int64_t>(), ids[w * seq + j + 1]);
    }
  }
  for (int world = 1; world <= 4; ++world) {
    std::vector<int> seen(20, 0);
    int64_t next = 0;
    for (int r = 0; r < world; ++r) {
      auto share = f.val_windows(r, world);
      EXPECT_EQ(share.first, next) << "contiguous, in rank order";
      next = share.first + share.count;
      for (int64_t w = share.first; w < share.first + share.count; ++w) ++seen[w];
      auto mine = f.val_batch(share.first, share.count);
      EXPECT_TRUE(torch::equal(mine.inputs, all.inputs.narrow(0, share.first, share.count)));
    }
    for (int w = 0; w < 20; ++w) EXPECT_EQ(seen[w], 1) << "window " << w << " world " << world;
  }
  // Exactly seq + 1 tokens: one window; the last token is only ever a target.
  std::remove(path.c_str());
  path = write_tokens(counting(11, 97));
  EXPECT_EQ(TokenFile(path, options(97, 10)).val_window_count(), 1);
  std::remove(path.c_str());
}

// A loss mask (one byte per token): targets whose byte is 0 are -100, the inputs and the other
// targets are the file's; a mask of the wrong size, a byte other than 0 and 1, or one that
// counts nothing is refused naming the files.
TEST(TokenFile, LossMaskLeavesTargetsOut) {
  const int64_t n = 300, seq = 12, vocab = 61;
  auto ids = counting(n, vocab);
  auto path = write_tokens(ids);
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i / 7) % 2;  // spans of 7
  auto mask_path = write_tokens(mask);
  auto o = options(vocab, seq, 9);
  o.loss_mask = mask_path;
  TokenFile f(path, o);
  TokenFile plain(path, options(vocab, seq, 9));
  for (int64_t step : {0, 3}) {
    auto b = f.batch(step, 0, 4), p = plain.batch(step, 0, 4);
    EXPECT_TRUE(torch::equal(b.inputs, p.inputs));
    int64_t out = 0;
    for (int64_t r = 0; r < 4; ++r) {
      const uint64_t start = mix_by_hand(mix_by_hand(mix_by_hand(9) ^ static_cast<uint64_t>(step)) ^
                                         static_cast<uint64_t>(r)) %
                             static_cast<uint64_t>(n - seq);
      for (int64_t j = 0; j < seq; ++j) {
        const int64_t want = mask[start + j + 1] ? ids[start + j + 1] : -100;
        ASSERT_EQ(b.targets[r][j].item<int64_t>(), want) << step << " " << r << " " << j;
        out += want == -100;
      }
    }
    EXPECT_GT(out, 0);
  }
  std::vector<uint8_t> short_mask(n - 1, 1), bad(n, 1), none(n, 0);
  bad[17] = 2;
  for (const auto& [m, needle] :
       {std::pair{short_mask, "299 bytes, but the token file"},
        std::pair{bad, "byte 17 is 2; expected 0 or 1"}, std::pair{none, "no token counts"}}) {
    auto q = options(vocab, seq);
    q.loss_mask = write_tokens(m);
    try {
      TokenFile g(path, q);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const fsdp::FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    std::remove(q.loss_mask.c_str());
  }
  std::remove(path.c_str());
  std::remove(mask_path.c_str());
}

TEST(TokenFile, BadSizesAndIdsAreNamed) {
  // 7 bytes: three and a half uint16 tokens.
  const std::string odd = scratch_path("odd") + ".bin";
  { std::ofstream(odd, std::ios::binary) << "abcdefg"; }
  expect_error_containing<FormatError>([&] { TokenFile(odd, options(100, 2)); },
                                       "token file " + odd +
                                           ": 7 bytes is not a whole number of "
                                           "uint16 tokens");
  // 6 bytes are not whole uint32 tokens either.
  const std::string six = scratch_path("six") + ".bin";
  { std::ofstream(six, std::ios::binary) << "abcdef"; }
  expect_error_containing<FormatError>(
      [&] { TokenFile(six, options(100, 1, 0, TokenDtype::kUInt32)); }, "6 bytes");
  const std::string empty = scratch_path("empty") + ".bin";
  { std::ofstream touch(empty, std::ios::binary); }
  expect_error_containing<FormatError>([&] { TokenFile(empty, options(100, 2)); }, "is empty");

  // An id >= vocab: named with its token index and byte offset, at open.
  auto ids = counting(3000000, 50);  // past the first 1M-token chunk of the scan
  ids[2100005] = 50;
  auto bad = write_tokens(ids);
  expect_error_containing<FormatError>(
      [&] { TokenFile(bad, options(50, 8)); },
      "token id 50 at token index 2100005 (byte offset 4200010) is not below the vocabulary "
      "size 50");
  // Without the scan, a batch that copies it fails the same way; others do not.
  auto o = options(50, 8);
  o.scan_at_open = false;
  TokenFile lazy(bad, o);
  EXPECT_NO_THROW(lazy.val_batch(0, 1000));
  expect_error_containing<FormatError>([&] { lazy.val_batch(262500, 1); },
                                       "token id 50 at token index 2100005");

  expect_error_containing<InvalidArgument>([&] { TokenFile(bad, options(70000, 8)); },
                                           "does not fit uint16 tokens");
  expect_error_containing<InvalidArgument>([&] { TokenFile("/nonexistent/t.bin", options(5, 2)); },
                                           "cannot open the token file /nonexistent/t.bin");
  auto small = write_tokens(counting(8, 50));
  expect_error_containing<InvalidArgument>([&] { TokenFile(small, options(50, 8)); },
                                           "holds 8 tokens; a sequence of seq 8 needs at least 9");
  for (const auto& p : {odd, six, empty, bad, small}) std::remove(p.c_str());
}

}  // namespace
}  // namespace fsdp::testing
