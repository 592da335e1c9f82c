// Fuzz target: a safetensors file (fsdp::read_safetensors_index, then every tensor through
// read_safetensors_rows). The input is written to a file in memory-backed /dev/shm; reading it
// must give entries inside the file or throw FormatError, never crash or throw anything else.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "fsdp/errors.h"
#include "fsdp/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/dev/shm/fsdp_fuzz_" + std::to_string(getpid()) + ".safetensors";
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return 0;
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  try {
    auto index = fsdp::read_safetensors_index(path);
    for (const auto& entry : index.entries) {
      const int64_t rows = entry.shape.empty() ? 1 : entry.shape[0];
      auto t = fsdp::read_safetensors_rows(path, entry, 0, rows);
      if (t.numel() * static_cast<int64_t>(t.element_size()) > static_cast<int64_t>(size)) {
        std::abort();  // read more bytes than the file has
      }
    }
  } catch (const fsdp::FormatError&) {
  }
  return 0;
}
