// Stands in for ggml.h when llama.cpp's common/json.cpp is compiled for the chat-template engine
// (cmake/FsdpLlamaJinja.cmake): that file takes only GGML_ASSERT from it, as nlohmann's
// JSON_ASSERT. Here a failed assertion throws instead of aborting the process.
#pragma once
#include <stdexcept>
#define GGML_ASSERT(x)                                                         \
  do {                                                                         \
    if (!(x)) throw std::logic_error("llama.cpp json: assertion failed: " #x); \
  } while (0)
