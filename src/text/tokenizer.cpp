// The byte-level BPE of a tokenizer.json (fsdp/text/tokenizer.h), following the `tokenizers`
// library's order: added tokens split out first, then the pre-tokenizer's pieces, each piece's
// bytes mapped to GPT-2's printable characters, then BPE merges by rank within each piece.
#include "fsdp/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "fsdp/errors.h"
#include "fsdp/io/files.h"

namespace fsdp::text {
namespace bpe_detail {

// GPT-2's pre-tokenizer regex (ByteLevel with use_regex).
const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for 256 + n.
std::vector<std::string> byte_chars() {
  std::vector<std::string> out(256);
  int n = 0;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    out[b] = utf8(printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++));
  }
  return out;
}

// The UTF-8 characters of `s`, each as its own string (invalid bytes one by one).
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The length of the valid UTF-8 sequence at s[i], or 0 (overlong forms, surrogates and code
// points above U+10FFFF are invalid, as in Rust's str).
size_t utf8_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (b(i + 1) < lo || b(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (b(i + k) < 0x80 || b(i + k) > 0xBF) return 0;
  }
  return n;
}

// The first invalid byte's offset, or npos.
size_t invalid_utf8_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string::npos;
}

// Rust's String::from_utf8_lossy, as tokenizers decodes: each invalid byte (or truncated
// sequence's first byte) becomes U+FFFD.
std::string utf8_lossy(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n > 0) {
      out.append(s, i, n);
      i += n;
      continue;
    }
    out += "\xEF\xBF\xBD";
    // A truncated sequence (a lead byte and some of its continuation bytes) is one U+FFFD.
    const auto c = static_cast<unsigned char>(s[i]);
    size_t want = c >= 0xF0 && c <= 0xF4   ? 4
                  : c >= 0xE0 && c <= 0xEF ? 3
                  : c >= 0xC2 && c <= 0xDF ? 2
                                           : 1;
    size_t k = 1;
    while (k < want && i + k < s.size() && (static_cast<unsigned char>(s[i + k]) & 0xC0) == 0x80)
      ++k;
    i += k;
  }
  return out;
}

// Unicode's canonical composition (NFC), as the tokenizers library's NFC normalizer.
std::string nfc(const std::string& s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                              static_cast<utf8proc_ssize_t>(s.size()), &out,
                              static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    throw InvalidArgument(fmt::format("tokenizer: NFC failed: {}", utf8proc_errmsg(n)));
  }
  std::string result(reinterpret_cast<char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

// A compiled PCRE2 pattern (UTF, Unicode properties) that splits text into its matches and
// the stretches between them (tokenizers' Split with behavior Isolated).
class Regex {
 public:
  explicit Regex(const std::string& pattern) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (!code_) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw InvalidArgument(
          fmt::format("tokenizer: the pre-tokenizer's regex {} does not compile "
                      "at {}: {}",
                      pattern, offset, reinterpret_cast<char*>(message)));
    }
  }
  ~Regex() {
    if (code_) pcre2_code_free(code_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Thread-safe: the match data is this call's own (the compiled code is only read).
  std::vector<std::string> split(const std::string& text) const {
    std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
        pcre2_match_data_create_from_pattern(code_, nullptr), &pcre2_match_data_free);
    std::vector<std::string> out;
    size_t start = 0, gap = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (start <= text.size()) {
      // The text was checked once (valid_utf8 in encode), not again at every match.
      const int rc =
          pcre2_match(code_, subject, text.size(), start, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        // Invalid UTF-8 (the tokenizers library takes only valid strings), or a match limit.
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        throw InvalidArgument(fmt::format("tokenizer: cannot split the text at byte {}: {}", start,
                                          reinterpret_cast<char*>(message)));
      }
      const PCRE2_SIZE* v = pcre2_get_ovector_pointer(data.get());
      const size_t b = v[0], e = v[1];
      if (e == b) {  // an empty match: step one character on
        start = b + (b < text.size() ? characters(text.substr(b, 4)).front().size() : 1);
        continue;
      }
      if (b > gap) out.push_back(text.substr(gap, b - gap));
      out.push_back(text.substr(b, e - b));
      gap = start = e;
    }
    if (gap < text.size()) out.push_back(text.substr(gap));
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
};

std::string dump_short(const nlohmann::json& j) {
  auto s = j.dump();
  return s.size() > 120 ? s.substr(0, 117) + "..." : s;
}

}  // namespace bpe_detail

struct Tokenizer::Impl {
  std::unordered_map<std::string, int64_t> vocab;
  std::vector<std::string> id_to_token;
  std::vector<bool> special;   // by id: an added token marked special
  std::vector<bool> is_added;  // by id: an added token (decoded as its content)
  // The merges, by the ids of the pair: (left << 32 | right) -> the merge's rank and the id of
  // the merged token.
  struct MergeRule {
    int rank;
    int64_t id;
  };
  std::unordered_map<uint64_t, MergeRule> merges;
  static uint64_t pair_key(int64_t left, int64_t right) {
    return (static_cast<uint64_t>(left) << 32) | static_cast<uint32_t>(right);
  }
  bool ignore_merges = false;
  // Added tokens, longest first (so that a longer one wins where two start at one place).
  std::vector<std::pair<std::string, int64_t>> added;
  std::vector<std::unique_ptr<bpe_detail::Regex>> splits;  // applied in order
  int byte_levels = 0;  // ByteLevel pre-tokenizers seen (exactly one is supported)
  bool nfc = false;     // the normalizer: NFC (Qwen2's) or none

  void read_normalizer(const nlohmann::json& n) {
    if (n.is_null()) return;
    const auto type = n.value("type", "");
    if (type == "Sequence") {
      for (const auto& m : n.at("normalizers")) read_normalizer(m);
    } else if (type == "NFC") {
      nfc = true;
    } else {
      throw InvalidArgument(
          fmt::format("normalizer {} is not supported (NFC is)", bpe_detail::dump_short(n)));
    }
  }
  std::vector<std::string> byte_char = bpe_detail::byte_chars();
  std::unordered_map<std::string, unsigned char> char_byte;
  std::vector<int64_t> prefix, suffix;  // the post-processor's ids around a sequence

  void read_pre_tokenizer(const nlohmann::json& p) {
    using bpe_detail::dump_short;
    if (p.is_null()) return;
    const auto type = p.value("type", "");
    if (type == "Sequence") {
      for (const auto& q : p.at("pretokenizers")) read_pre_tokenizer(q);
    } else if (type == "ByteLevel") {
      ++byte_levels;
      if (p.value("add_prefix_space", false)) {
        throw InvalidArgument("pre-tokenizer ByteLevel with add_prefix_space is not supported");
      }
      if (p.value("use_regex", true)) {
        splits.push_back(std::make_unique<bpe_detail::Regex>(bpe_detail::kGpt2Pattern));
      }
    } else if (type == "Digits") {
      // SmolLM2's: every digit its own piece (individual_digits), or each run of digits.
      splits.push_back(std::make_unique<bpe_detail::Regex>(
          p.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)"));
    } else if (type == "Split") {
      const auto& pattern = p.at("pattern");
      if (p.value("behavior", "") != "Isolated" || p.value("invert", false) ||
          !pattern.contains("Regex")) {
        throw InvalidArgument(fmt::format(
            "tokenizer: pre-tokenizer Split {} is not supported (a Regex with behavior Isolated "
            "is)",
            dump_short(p)));
      }
      splits.push_back(std::make_unique<bpe_detail::Regex>(pattern.at("Regex").get<std::string>()));
    } else {
      throw InvalidArgument(fmt::format(
          "tokenizer: pre-tokenizer {} is not supported (ByteLevel, Split, Digits and Sequence "
          "are)",
          dump_short(p)));
    }
  }

  void read_post_processor(const nlohmann::json& p) {
    using bpe_detail::dump_short;
    if (p.is_null()) return;
    const auto type = p.value("type", "");
    if (type == "Sequence") {
      for (const auto& q : p.at("processors")) read_post_processor(q);
    } else if (type == "TemplateProcessing") {
      bool after = false;
      for (const auto& item : p.at("single")) {
        if (item.contains("Sequence")) {
          after = true;
        } else if (item.contains("SpecialToken")) {
          const auto id = item["SpecialToken"].at("id").get<std::string>();
          for (const auto& i : p.at("special_tokens").at(id).at("ids")) {
            (after ? suffix : prefix).push_back(i.get<int64_t>());
          }
        }
      }
    } else if (type != "ByteLevel") {
      throw InvalidArgument(fmt::format(
          "tokenizer: post-processor {} is not supported (TemplateProcessing, ByteLevel and "
          "Sequence are)",
          dump_short(p)));
    }
  }

  // BPE within one pre-token's characters.
  void bpe(const std::string& piece, std::vector<int64_t>& out) const {
    std::string mapped;
    for (unsigned char b : piece) mapped += byte_char[b];
    if (ignore_merges) {
      if (auto it = vocab.find(mapped); it != vocab.end()) {
        out.push_back(it->second);
        return;
      }
    }
    // As the tokenizers library merges a word: a list of symbols and a queue of the merges of
    // adjacent pairs, the lowest rank first and the leftmost among equal ranks; an entry whose
    // pair has changed since it was queued is skipped. O(n log n) in the piece's length.
    const auto chars = bpe_detail::characters(mapped);
    struct Symbol {
      int64_t id;
      int prev, next;  // neighbours in the list (-1: none)
      bool alive;
    };
    const int n = static_cast<int>(chars.size());
    std::vector<Symbol> sym(chars.size());
    for (int i = 0; i < n; ++i) {
      auto it = vocab.find(chars[i]);
      if (it == vocab.end()) {
        throw InvalidArgument(fmt::format(
            "tokenizer: '{}' is not in the vocabulary (a byte-level BPE holds every byte)",
            chars[i]));
      }
      sym[i] = {it->second, i - 1, i + 1 < n ? i + 1 : -1, true};
    }
    using Candidate = std::tuple<int, int, int64_t>;  // rank, left symbol, merged id
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    auto offer = [&](int left) {
      const int right = sym[left].next;
      if (right < 0) return;
      auto it = merges.find(pair_key(sym[left].id, sym[right].id));
      if (it != merges.end()) queue.emplace(it->second.rank, left, it->second.id);
    };
    for (int i = 0; i + 1 < n; ++i) offer(i);
    while (!queue.empty()) {
      const auto [rank, left, id] = queue.top();
      queue.pop();
      Symbol& l = sym[left];
      if (!l.alive || l.next < 0) continue;
      Symbol& r = sym[l.next];
      auto it = merges.find(pair_key(l.id, r.id));
      if (it == merges.end() || it->second.id != id) continue;  // the pair has changed
      l.id = id;
      r.alive = false;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = left;
      if (l.prev >= 0) offer(l.prev);
      offer(left);
    }
    for (int i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
  }

  void encode_plain(const std::string& text, std::vector<int64_t>& out) const {
    std::vector<std::string> pieces = {nfc ? bpe_detail::nfc(text) : text};
    for (const auto& r : splits) {
      std::vector<std::string> next;
      for (const auto& p : pieces) {
        auto parts = r->split(p);
        next.insert(next.end(), parts.begin(), parts.end());
      }
      pieces = std::move(next);
    }
    for (const auto& p : pieces) bpe(p, out);
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

Tokenizer Tokenizer::from_file(const std::string& path_in) {
  using bpe_detail::dump_short;
  const std::string path =
      io::is_directory(path_in) ? io::without_trailing_slash(path_in) + "/tokenizer.json" : path_in;
  if (!io::path_exists(path)) {
    throw InvalidArgument(
        fmt::format("tokenizer: {} does not exist (expected a Hugging Face "
                    "tokenizer.json, or a directory holding one)",
                    path));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(io::read_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("tokenizer: {} is not valid JSON: {}", path, e.what()));
  }
  auto impl = std::make_unique<Impl>();
  try {
    const auto& model = j.at("model");
    if (model.value("type", "") != "BPE" || model.value("byte_fallback", false)) {
      throw InvalidArgument(fmt::format(
          "model {} is not a byte-level BPE (WordPiece, Unigram and SentencePiece-style BPE with "
          "byte_fallback are not supported: a tokenizer.model goes through SentencePiece)",
          dump_short(model).substr(0, 60)));
    }
    impl->read_normalizer(j.value("normalizer", nlohmann::json()));
    const auto& decoder = j.value("decoder", nlohmann::json());
    if (decoder.is_null() || decoder.value("type", "") != "ByteLevel") {
      throw InvalidArgument(
          fmt::format("decoder {} is not supported (ByteLevel is)", dump_short(decoder)));
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"}) {
      const auto v = model.value(key, nlohmann::json());
      if (!v.is_null() && !(v.is_string() && v.get<std::string>().empty())) {
        throw InvalidArgument(fmt::format("model {} {} is not supported", key, v.dump()));
      }
    }
    impl->ignore_merges = model.value("ignore_merges", false);
    int64_t size = 0;
    for (const auto& [token, id] : model.at("vocab").items()) {
      impl->vocab[token] = id.get<int64_t>();
      size = std::max(size, id.get<int64_t>() + 1);
    }
    int rank = 0;
    for (const auto& m : model.at("merges")) {
      std::pair<std::string, std::string> pair;
      if (m.is_string()) {
        const auto s = m.get<std::string>();
        const auto space = s.find(' ');
        if (space == std::string::npos) throw InvalidArgument("merge '" + s + "' has no space");
        pair = {s.substr(0, space), s.substr(space + 1)};
      } else {
        pair = {m.at(0).get<std::string>(), m.at(1).get<std::string>()};
      }
      // As the tokenizers library builds its merges: the three tokens must be in the
      // vocabulary, and a pair listed twice keeps its last rank.
      int64_t ids[3];
      const std::string tokens[3] = {pair.first, pair.second, pair.first + pair.second};
      for (int k = 0; k < 3; ++k) {
        auto it = impl->vocab.find(tokens[k]);
        if (it == impl->vocab.end()) {
          throw InvalidArgument(fmt::format("merge '{} {}': '{}' is not in the vocabulary",
                                            pair.first, pair.second, tokens[k]));
        }
        ids[k] = it->second;
      }
      impl->merges[Impl::pair_key(ids[0], ids[1])] = {rank++, ids[2]};
    }
    std::vector<std::pair<int64_t, bool>> added_ids;
    for (const auto& a : j.value("added_tokens", nlohmann::json::array())) {
      const auto content = a.at("content").get<std::string>();
      for (const char* flag : {"lstrip", "rstrip", "single_word"}) {
        if (a.value(flag, false)) {
          throw InvalidArgument(
              fmt::format("added token '{}' with {} is not supported", content, flag));
        }
      }
      const auto id = a.at("id").get<int64_t>();
      impl->vocab[content] = id;
      impl->added.emplace_back(content, id);
      added_ids.emplace_back(id, a.value("special", false));
      size = std::max(size, id + 1);
    }
    std::stable_sort(impl->added.begin(), impl->added.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
    impl->id_to_token.assign(size, "");
    impl->special.assign(size, false);
    impl->is_added.assign(size, false);
    for (const auto& [token, id] : impl->vocab) impl->id_to_token[id] = token;
    for (const auto& [id, special] : added_ids) {
      impl->special[id] = special;
      impl->is_added[id] = true;
    }
    impl->read_pre_tokenizer(j.value("pre_tokenizer", nlohmann::json()));
    if (impl->byte_levels != 1) {
      throw InvalidArgument(
          fmt::format("the pre-tokenizer has {} ByteLevel steps; a byte-level BPE has exactly one",
                      impl->byte_levels));
    }
    impl->read_post_processor(j.value("post_processor", nlohmann::json()));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(fmt::format("tokenizer {}: {}", path, e.what()));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("tokenizer {}: unexpected layout: {}", path, e.what()));
  }
  for (int b = 0; b < 256; ++b) impl->char_byte[impl->byte_char[b]] = static_cast<unsigned char>(b);
  return Tokenizer(std::move(impl));
}

std::vector<int64_t> Tokenizer::encode(std::string_view text_in, bool add_special) const {
  const Impl& t = *impl_;
  const std::string text(text_in);
  if (const size_t bad = bpe_detail::invalid_utf8_at(text); bad != std::string::npos) {
    throw InvalidArgument(
        fmt::format("tokenizer: the text is not valid UTF-8 (byte {} of {})", bad, text.size()));
  }
  std::vector<int64_t> out;
  if (add_special) out = t.prefix;
  // Added tokens first: the text between them is encoded on its own.
  size_t pos = 0, plain = 0;
  while (pos < text.size()) {
    const std::pair<std::string, int64_t>* hit = nullptr;
    for (const auto& a : t.added) {
      if (!a.first.empty() && text.compare(pos, a.first.size(), a.first) == 0) {
        hit = &a;
        break;
      }
    }
    if (!hit) {
      ++pos;
      continue;
    }
    if (pos > plain) t.encode_plain(text.substr(plain, pos - plain), out);
    out.push_back(hit->second);
    pos += hit->first.size();
    plain = pos;
  }
  if (plain < text.size()) t.encode_plain(text.substr(plain), out);
  if (add_special) out.insert(out.end(), t.suffix.begin(), t.suffix.end());
  return out;
}

std::string Tokenizer::decode(const std::vector<int64_t>& ids, bool skip_special) const {
  const Impl& t = *impl_;
  std::string out;
  for (const auto id : ids) {
    if (id < 0 || id >= static_cast<int64_t>(t.id_to_token.size()) || t.id_to_token[id].empty()) {
      throw InvalidArgument(fmt::format("tokenizer: id {} is not in the vocabulary ({} ids)", id,
                                        t.id_to_token.size()));
    }
    if (t.is_added[id]) {
      if (!(skip_special && t.special[id])) out += t.id_to_token[id];
      continue;
    }
    for (const auto& c : bpe_detail::characters(t.id_to_token[id])) {
      auto it = t.char_byte.find(c);
      out += it != t.char_byte.end() ? std::string(1, static_cast<char>(it->second)) : c;
    }
  }
  return bpe_detail::utf8_lossy(out);
}

const std::vector<int64_t>& Tokenizer::prefix_ids() const { return impl_->prefix; }

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->id_to_token.size()); }

std::optional<int64_t> Tokenizer::token_to_id(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

}  // namespace fsdp::text
