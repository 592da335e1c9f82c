// Deprecated: chat templates have moved to the optional text library (fsdp/text/chat_template.h,
// namespace fsdp::text, CMake target fsdp::text). This header and the old names keep a program
// written against fsdp::models::ChatTemplate and ChatMessage compiling, with a deprecation
// warning; it now links fsdp::text.
#pragma once

#include "fsdp/text/chat_template.h"

namespace fsdp::models {

using ChatMessage
    [[deprecated("fsdp::models::ChatMessage is fsdp::text::ChatMessage "
                 "(fsdp/text/chat_template.h, library fsdp::text)")]] = text::ChatMessage;
using ChatTemplate
    [[deprecated("fsdp::models::ChatTemplate is fsdp::text::ChatTemplate "
                 "(fsdp/text/chat_template.h, library fsdp::text)")]] = text::ChatTemplate;

}  // namespace fsdp::models
