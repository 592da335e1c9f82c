// A program written before the tokenizer and chat templates moved out of fsdp::models into the
// optional text library: the old headers and names, unchanged. It must build (with deprecation
// warnings) against the installed package, linking fsdp::text, and run: a chat template
// rendered (where the build has the engine) and a missing tokenizer.json refused by name.
#include <fsdp/errors.h>
#include <fsdp/models/chat_template.h>
#include <fsdp/models/tokenizer.h>

#include <iostream>
#include <string>

int main() {
  int failures = 0;
  try {
    const auto tmpl = fsdp::models::ChatTemplate::from_source(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}");
    const std::vector<fsdp::models::ChatMessage> messages = {{"user", "hi"}};
    const std::string text = tmpl.render(messages);
    std::cout << "previous_text_api: rendered " << text << "\n";
    if (text != "<user>hi<assistant>") ++failures;
  } catch (const fsdp::InvalidArgument& e) {
    // A build configured with FSDP_WITH_CHAT_TEMPLATES=OFF: the stub names that.
    std::cout << "previous_text_api: " << e.what() << "\n";
    if (std::string(e.what()).find("FSDP_WITH_CHAT_TEMPLATES=OFF") == std::string::npos) ++failures;
  }
  try {
    (void)fsdp::models::Tokenizer::from_file("/nonexistent/tokenizer.json");
    ++failures;
  } catch (const fsdp::Error& e) {
    std::cout << "previous_text_api: refused: " << e.what() << "\n";
  }
  return failures == 0 ? 0 : 1;
}
