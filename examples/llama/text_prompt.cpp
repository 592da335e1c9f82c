#include "text_prompt.h"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "fsdp/errors.h"
#ifdef FSDP_HAVE_TEXT
#include "fsdp/text/chat_template.h"
#include "fsdp/text/tokenizer.h"
#endif

namespace llama {

#ifdef FSDP_HAVE_TEXT

namespace {

// --chat's conversation: --system's turn (when given), then --generate's text as the user's.
std::vector<fsdp::text::ChatMessage> chat_messages(const Options& o) {
  std::vector<fsdp::text::ChatMessage> messages;
  if (!o.system_prompt.empty()) messages.push_back({"system", o.system_prompt});
  messages.push_back({"user", o.generate_text});
  return messages;
}

}  // namespace

bool have_tokenizer() { return true; }

bool have_chat_templates() {
#ifdef FSDP_HAVE_CHAT_TEMPLATES
  return true;
#else
  return false;
#endif
}

std::string check_text_prompt(const Options& o) {
  if (!o.chat) return "";
  if (!have_chat_templates()) {
    return "--chat: this build has no chat templates (configured with "
           "FSDP_WITH_CHAT_TEMPLATES=OFF); render the conversation yourself and give it to "
           "--generate, or its ids to --generate-ids";
  }
  try {
    (void)fsdp::text::ChatTemplate::from_directory(o.hf_dir).render(chat_messages(o));
  } catch (const std::exception& e) {
    return fmt::format("--chat: {}", e.what());
  }
  return "";
}

TextPrompt encode_text_prompt(const Options& o) {
  auto tokenizer = std::make_shared<fsdp::text::Tokenizer>(
      fsdp::text::Tokenizer::from_file(o.hf_dir + "/tokenizer.json"));
  TextPrompt p;
  if (o.chat) {
    // As transformers' apply_chat_template(tokenize=True): the template writes every special
    // token itself (the BOS too), so the text is encoded without the post-processor's.
    const auto text = fsdp::text::ChatTemplate::from_directory(o.hf_dir).render(chat_messages(o));
    p.ids = tokenizer->encode(text, /*add_special=*/false);
  } else {
    p.ids = tokenizer->encode(o.generate_text);
    // A rendered chat template starts with the BOS the post-processor adds (transformers'
    // apply_chat_template encodes without special tokens): not twice.
    const auto& bos = tokenizer->prefix_ids();
    if (!bos.empty() && p.ids.size() >= 2 * bos.size() &&
        std::equal(bos.begin(), bos.end(), p.ids.begin() + static_cast<int64_t>(bos.size()))) {
      p.ids.erase(p.ids.begin(), p.ids.begin() + static_cast<int64_t>(bos.size()));
    }
  }
  p.decode = [tokenizer](const std::vector<int64_t>& ids) { return tokenizer->decode(ids); };
  return p;
}

#else  // a build without the text library

namespace {

constexpr const char* kNoText =
    "this build has no text library (fsdp::text: the tokenizer and chat templates; configured "
    "with FSDP_WITH_TEXT=OFF, or without PCRE2 and utf8proc); give the prompt's ids with "
    "--generate-ids";

}  // namespace

bool have_tokenizer() { return false; }
bool have_chat_templates() { return false; }

std::string check_text_prompt(const Options& o) {
  if (o.generate_text.empty()) return "";
  return fmt::format("{}: {}", o.chat ? "--chat" : "--generate TEXT", kNoText);
}

TextPrompt encode_text_prompt(const Options&) {
  throw fsdp::InvalidArgument(fmt::format("--generate TEXT: {}", kNoText));
}

#endif

}  // namespace llama
