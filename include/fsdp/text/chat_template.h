// A model's chat template in C++: renders a conversation into the text an instruct model was
// trained on, as transformers' tokenizer.apply_chat_template(messages, tokenize=False,
// add_generation_prompt=...) does, so that a C++ program prompts a chat model without Python.
//
//   auto tmpl = fsdp::text::ChatTemplate::from_directory(hf_dir);
//   std::string text = tmpl.render({{"system", "Be brief."}, {"user", "Hello"}});
//   std::vector<int64_t> ids = tokenizer.encode(text, /*add_special=*/false);  // as transformers
//
// The engine is llama.cpp's Jinja (common/jinja, MIT), built from llama-cpp-python's pinned
// source release (cmake/FsdpLlamaJinja.cmake): it parses with transformers' settings (trim_blocks,
// lstrip_blocks) and has the functions templates call (raise_exception, strftime_now, tojson,
// namespace, ...). tests/reference/chat_template_check.py renders the published templates that
// llama.cpp ships (Llama 3.1 to 3.3, Qwen2.5, Qwen3, SmolLM3, Gemma 2, Phi-3.5, Mistral, DeepSeek
// R1 distills, ...) with both on the same conversations and requires equal texts and ids.
// What it does not do: tools and documents (passed as None, as transformers does without them),
// multimodal content lists, continue_final_message and the assistant mask (transformers'
// {% generation %}); messages are role and text only. Thread-safe: render is const, each call
// has its own interpreter state (and strftime_now uses localtime_r).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::text {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant" (what the template knows)
  std::string content;  // the text
};

class ChatTemplate {
 public:
  // From a Hugging Face model directory, as transformers' AutoTokenizer finds the template:
  // chat_template.jinja, else tokenizer_config.json's "chat_template" (a string, or a list of
  // {"name", "template"} of which "default" is taken). The special tokens the template may use
  // (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token) come from
  // tokenizer_config.json, else special_tokens_map.json (a string or an {"content": ...}).
  // InvalidArgument naming the directory when it has no template, the file when its JSON or the
  // template does not parse (with the engine's message and the source around the place).
  static ChatTemplate from_directory(const std::string& dir);
  // A template's source and the special tokens beside it; `origin` names it in errors.
  static ChatTemplate from_source(std::string source,
                                  std::map<std::string, std::string> special_tokens = {},
                                  std::string origin = "chat template");
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The text of `messages`; with add_generation_prompt, followed by what opens the assistant's
  // turn (the prompt to generate after). InvalidArgument for an empty role, and for what the
  // template itself refuses (its raise_exception: "Conversation roles must alternate ..."),
  // with the template's message.
  std::string render(const std::vector<ChatMessage>& messages,
                     bool add_generation_prompt = true) const;
  const std::string& source() const;
  const std::map<std::string, std::string>& special_tokens() const;

 private:
  struct Impl;
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fsdp::text
