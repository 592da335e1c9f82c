// Deprecated: the tokenizer has moved to the optional text library (fsdp/text/tokenizer.h,
// namespace fsdp::text, CMake target fsdp::text). This header and the old name keep a program
// written against fsdp::models::Tokenizer compiling, with a deprecation warning; it now links
// fsdp::text.
#pragma once

#include "fsdp/text/tokenizer.h"

namespace fsdp::models {

using Tokenizer
    [[deprecated("fsdp::models::Tokenizer is fsdp::text::Tokenizer "
                 "(fsdp/text/tokenizer.h, library fsdp::text)")]] = text::Tokenizer;

}  // namespace fsdp::models
