// Internal: the file names of a Hugging Face model directory's weights.
#pragma once

namespace fsdp::models::llama::detail {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

}  // namespace fsdp::models::llama::detail
