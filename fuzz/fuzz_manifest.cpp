// Fuzz target: a checkpoint's manifest.json (fsdp::detail::manifest_from_json). It must
// return a manifest whose rows lie inside their tensors, or throw CheckpointError; never crash,
// never throw anything else.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "checkpoint/manifest.h"
#include "fsdp/checkpoint/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const auto m = fsdp::detail::manifest_from_json(text, "fuzz/manifest.json");
    for (const auto& t : m.tensors) {
      const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
      for (const auto& r : t.rows) {
        if (r.row_begin < 0 || r.row_end < r.row_begin || r.row_end > rows || r.offset < 0 ||
            r.chunk_rows < 1) {
          std::abort();  // accepted rows outside the tensor
        }
      }
    }
  } catch (const fsdp::CheckpointError&) {
  }
  return 0;
}
