// A Hugging Face tokenizer.json in C++: the byte-level BPE of GPT-2, Llama 3, SmolLM2 and Qwen2,
// encoding and decoding as the `tokenizers` library does, so that a C++ program turns text into a
// model's ids and back without Python. Checked by tests/reference/tokenizer_check.py against
// `tokenizers` on tokenizers of those four forms trained offline, and by
// published_tokenizers_check.py on seven published vocabularies (Llama 3, Qwen1.5/2, GPT-2,
// StarCoder2, Refact, MPT, Command-R: llama.cpp's test data, with the ids the models' own
// tokenizers gave). Thread-safe (encode and decode are const).
//
//   auto tok = fsdp::text::Tokenizer::from_file(dir + "/tokenizer.json");
//   std::vector<int64_t> ids = tok.encode("Hello world");   // with the post-processor's BOS
//   std::string text = tok.decode(ids, /*skip_special=*/true);
//
// What it reads: model BPE (vocab, merges as "a b" or ["a", "b"], ignore_merges); the added
// tokens (matched literally in the text before anything else, longest first, special or not);
// the pre-tokenizer ByteLevel (GPT-2's regex when use_regex) or a Sequence of Splits (a regex,
// behavior Isolated), Digits and one ByteLevel; normalizer none or NFC (utf8proc; applied to
// the text between added tokens); post-processor none, ByteLevel,
// TemplateProcessing (its "single" template) or a Sequence of them; decoder ByteLevel. Anything
// else is refused by name at load (InvalidArgument, never a silently different encoding):
// other normalizers (NFKC, Lowercase, ...), other pre-tokenizers (Metaspace, Whitespace), byte
// fallback, WordPiece and Unigram, ByteLevel's add_prefix_space, added tokens with lstrip,
// rstrip or single_word, BPE dropout and subword prefixes or suffixes. Known differences: none
// on the tested texts; PCRE2's \s also matches U+180E, which the tokenizers library's regex
// engine does not. Merging is the tokenizers library's (a queue of the pairs' merges, the lowest
// rank and then the leftmost first): O(n log n) in a piece's length.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::text {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one. IoError when it cannot be read,
  // InvalidArgument when it is not JSON or describes what is not supported (named).
  static Tokenizer from_file(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text` (valid UTF-8, else InvalidArgument); with add_special, the
  // post-processor's tokens around them (Llama 3's <|begin_of_text|>), as tokenizers'
  // encode(text, add_special_tokens=True).
  std::vector<int64_t> encode(std::string_view text, bool add_special = true) const;
  // The text of `ids`; added tokens as their content unless they are special and skip_special;
  // bytes that do not form UTF-8 (a character cut by the last id) become U+FFFD, as tokenizers
  // decodes. InvalidArgument for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;
  // One more than the largest id (the vocabulary with the added tokens).
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(const std::string& token) const;
  // The post-processor's ids before a sequence (empty without one).
  const std::vector<int64_t>& prefix_ids() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::text
