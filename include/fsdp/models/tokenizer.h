// A Hugging Face tokenizer.json in C++: the byte-level BPE that GPT-2, Llama 3, SmolLM2 and
// Qwen2 ship, encoding and decoding exactly as the `tokenizers` library does (the ids are
// checked against it by tests/reference/tokenizer_check.py), so that a C++ program turns text
// into a model's ids and back without Python.
//
//   auto tok = fsdp::models::Tokenizer::from_file(dir + "/tokenizer.json");
//   std::vector<int64_t> ids = tok.encode("Hello world");   // with the post-processor's BOS
//   std::string text = tok.decode(ids, /*skip_special=*/true);
//
// What it reads: model BPE (vocab, merges as "a b" or ["a", "b"], ignore_merges); the added
// tokens (matched literally in the text before anything else, special or not); the
// pre-tokenizer ByteLevel (GPT-2's regex when use_regex, add_prefix_space) or a Sequence of
// Split (a regex, behavior Isolated) and ByteLevel; normalizer none; post-processor none,
// ByteLevel, TemplateProcessing (its "single" template) or a Sequence of them; decoder ByteLevel.
// Anything else (SentencePiece-style Metaspace and byte fallback, WordPiece, normalizers such
// as NFC) is refused by name at load: InvalidArgument, never a silently different encoding.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::models {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one. IoError when it cannot be read,
  // InvalidArgument when it is not JSON or describes what is not supported (named).
  static Tokenizer from_file(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // The ids of `text` (UTF-8); with add_special, the post-processor's tokens around them
  // (Llama 3's <|begin_of_text|>), as tokenizers' encode(text, add_special_tokens=True).
  std::vector<int64_t> encode(std::string_view text, bool add_special = true) const;
  // The text of `ids`; added tokens as their content unless they are special and skip_special.
  // InvalidArgument for an id outside the vocabulary.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = false) const;
  // One more than the largest id (the vocabulary with the added tokens).
  int64_t vocab_size() const;
  std::optional<int64_t> token_to_id(const std::string& token) const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::models
