// Internal: a checkpoint's manifest.json (fsdp/checkpoint/checkpoint.h describes the layout): what
// was saved, by which world size, and where every rank's rows of every tensor are.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::detail {

// Rows [row_begin, row_end) of a tensor, stored at `offset` in one rank's file, with a CRC-32
// of every `chunk_rows` rows (the last chunk may be shorter).
struct StoredRows {
  int rank = 0;
  std::string file;  // relative to the checkpoint directory
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0, nbytes = 0;
  int64_t chunk_rows = 1;
  std::vector<uint32_t> crc32;
};

struct StoredTensor {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;  // global
  std::vector<StoredRows> rows;
};

struct Manifest {
  int world_size = 0;
  int64_t step = 0;
  std::string library_version;
  std::map<std::string, std::string> metadata;
  std::string optimizer = "none";                  // none | adamw | sgd
  std::map<std::string, int64_t> optimizer_steps;  // AdamW's step count per parameter name
  std::vector<StoredTensor> tensors;
  bool partial = false;  // SaveOptions::filter left some of the model's tensors out
};

inline constexpr const char* kManifestName = "manifest.json";

std::string manifest_to_json(const Manifest& m);
// Parses and checks the structure (every field present with its type, known dtypes, rows
// inside the shape, offsets non-negative); CheckpointError naming `path` and the entry.
Manifest manifest_from_json(const std::string& text, const std::string& path);

// The CRC-32 of `bytes` (libtorch's crc32_fast, which the rank files' chunks carry too).
uint32_t checksum(std::string_view bytes);

// "F32", "BF16", ... (safetensors' names); CheckpointError for dtypes a checkpoint cannot hold.
std::string dtype_name(at::ScalarType t);

// Bytes of one row of dim 0 (a 0-d tensor is one row of one element).
int64_t row_bytes(const std::vector<int64_t>& shape, at::ScalarType dtype);

}  // namespace fsdp::detail
