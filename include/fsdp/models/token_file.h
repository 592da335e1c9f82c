// Deprecated path (since 0.2.0): token files are data loading, not a model; they moved to
// fsdp/data/token_file.h, namespace fsdp::data. These aliases keep programs written against
// fsdp::models compiling (with deprecation warnings) until 0.3.0.
#pragma once

#include <cstdint>
#include <string>

#include "fsdp/data/token_file.h"

namespace fsdp::models {

using TokenDtype [[deprecated("use fsdp::data::TokenDtype")]] = data::TokenDtype;
using Share [[deprecated("use fsdp::data::Share")]] = data::Share;
using TokenBatch [[deprecated("use fsdp::data::TokenBatch")]] = data::TokenBatch;
using TokenFileOptions [[deprecated("use fsdp::data::TokenFileOptions")]] = data::TokenFileOptions;
using TokenFile [[deprecated("use fsdp::data::TokenFile")]] = data::TokenFile;

[[deprecated("use fsdp::data::parse_token_dtype")]] inline data::TokenDtype parse_token_dtype(
    const std::string& name) {
  return data::parse_token_dtype(name);
}
[[deprecated("use fsdp::data::token_dtype_name")]] inline const char* token_dtype_name(
    data::TokenDtype dtype) {
  return data::token_dtype_name(dtype);
}
[[deprecated("use fsdp::data::splitmix64")]] inline uint64_t splitmix64(uint64_t x) {
  return data::splitmix64(x);
}
[[deprecated("use fsdp::data::draw")]] inline uint64_t draw(uint64_t seed, uint64_t step,
                                                            uint64_t index) {
  return data::draw(seed, step, index);
}
[[deprecated("use fsdp::data::share")]] inline data::Share share(int64_t total, int rank,
                                                                 int world) {
  return data::share(total, rank, world);
}

}  // namespace fsdp::models
