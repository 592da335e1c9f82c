// train_llama's text prompts: --generate TEXT encoded by --hf-dir's tokenizer.json, --chat's
// conversation put through its chat template, and the generated ids decoded back to text. The
// one part of the trainer that uses the optional text library (fsdp::text, FSDP_WITH_TEXT);
// in a build without it (FSDP_HAVE_TEXT undefined) every function here names what is missing,
// and --generate-ids still generates.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "llama_options.h"

namespace llama {

// Whether this build can encode text (the text library) and render chat templates (its engine).
bool have_tokenizer();
bool have_chat_templates();

// Checked before any weight is loaded: "" or the message naming what is wrong. --generate TEXT
// needs the text library; --chat also its template engine, and --hf-dir's template, which is
// read, parsed and rendered now (a base model's directory without one, a template that does not
// parse, a conversation it refuses: a system turn where it has none).
std::string check_text_prompt(const Options& o);

struct TextPrompt {
  std::vector<int64_t> ids;
  // The text of generated ids, as the tokenizer decodes them.
  std::function<std::string(const std::vector<int64_t>&)> decode;
};

// --generate's text (after --chat's template when given) as the model's ids. InvalidArgument
// in a build without the text library.
TextPrompt encode_text_prompt(const Options& o);

}  // namespace llama
