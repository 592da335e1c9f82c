// The logits of the first `count` validation windows, written by rank 0 to a safetensors file
// (tensor "logits", fp32, the whole vocabulary gathered under --tp): train_llama's deprecated
// --dump-logits, and the tests' tests/support/llama_dump_logits.cpp, which the parity tests
// compare with transformers' logits.
#pragma once

#include <cstdint>
#include <string>

#include "llama_build.h"
#include "token_data.h"

namespace llama {

// Every rank runs the forward (collective); rank 0 writes `path` and says so.
void write_logits(const std::string& path, int64_t count, Built& b, const TokenData& val,
                  const fsdp::Distributed& dist);

}  // namespace llama
