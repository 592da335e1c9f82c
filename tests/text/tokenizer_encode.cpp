// tokenizer_encode TOKENIZER TEXTS [--no-special]: encodes every line of the file TEXTS (a JSON
// list of strings) with fsdp::text::Tokenizer and prints one JSON object: {"ids": [[...],
// ...], "decoded": ["...", ...], "decoded_cut": [...]} (decoded with special tokens kept; the
// cut ones without each text's last id, where a character may end half-way). For
// tests/reference/tokenizer_check.py, which holds them against the `tokenizers` library.
// Exits 1 with the error on stderr when the tokenizer is refused.
#include <fmt/format.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fsdp/text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: tokenizer_encode TOKENIZER TEXTS.json [--no-special]\n";
    return 2;
  }
  const bool special = !(argc > 3 && std::string(argv[3]) == "--no-special");
  try {
    const auto tok = fsdp::text::Tokenizer::from_file(argv[1]);
    std::ifstream in(argv[2]);
    const auto texts = nlohmann::json::parse(in).get<std::vector<std::string>>();
    nlohmann::json out;
    out["ids"] = nlohmann::json::array();
    out["decoded"] = nlohmann::json::array();
    out["decoded_cut"] = nlohmann::json::array();  // without the last id: a character may be cut
    for (const auto& t : texts) {
      const auto ids = tok.encode(t, special);
      out["ids"].push_back(ids);
      out["decoded"].push_back(tok.decode(ids));
      out["decoded_cut"].push_back(
          tok.decode(std::vector<int64_t>(ids.begin(), ids.end() - (ids.empty() ? 0 : 1))));
    }
    out["vocab_size"] = tok.vocab_size();
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
