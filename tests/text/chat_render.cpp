// chat_render CONVERSATIONS DIR...: renders every conversation of the JSON file CONVERSATIONS
// ([{"messages": [{"role", "content"}...], "add_generation_prompt": bool}...]) with each model
// directory's chat template (fsdp::text::ChatTemplate::from_directory) and prints one JSON
// object: {DIR: {"results": [{"text", "ids"} or {"error"}...]} or {"error"} when the directory
// is refused}. "ids" is the text encoded without special tokens by the directory's
// tokenizer.json, as transformers' apply_chat_template(tokenize=True) encodes. For
// tests/reference/chat_template_check.py, which holds them against transformers.
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "fsdp/text/chat_template.h"
#include "fsdp/text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: chat_render CONVERSATIONS.json DIR...\n";
    return 2;
  }
  nlohmann::json conversations;
  try {
    conversations = nlohmann::json::parse(std::ifstream(argv[1]));
  } catch (const std::exception& e) {
    std::cerr << "error: " << argv[1] << ": " << e.what() << "\n";
    return 2;
  }
  nlohmann::json out = nlohmann::json::object();
  for (int a = 2; a < argc; ++a) {
    const std::string dir = argv[a];
    nlohmann::json entry;
    try {
      const auto tmpl = fsdp::text::ChatTemplate::from_directory(dir);
      std::optional<fsdp::text::Tokenizer> tok;
      if (std::ifstream(dir + "/tokenizer.json")) tok = fsdp::text::Tokenizer::from_file(dir);
      entry["results"] = nlohmann::json::array();
      for (const auto& c : conversations) {
        std::vector<fsdp::text::ChatMessage> messages;
        for (const auto& m : c["messages"]) {
          messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
        }
        nlohmann::json r;
        try {
          r["text"] = tmpl.render(messages, c["add_generation_prompt"].get<bool>());
          if (tok) r["ids"] = tok->encode(r["text"].get<std::string>(), /*add_special=*/false);
        } catch (const std::exception& e) {
          r = {{"error", e.what()}};
        }
        entry["results"].push_back(r);
      }
    } catch (const std::exception& e) {
      entry = {{"error", e.what()}};
    }
    out[dir] = entry;
  }
  std::cout << out.dump() << "\n";
  return 0;
}
