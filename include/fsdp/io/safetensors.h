// safetensors files: the weights format PyTorch, Hugging Face, MLX and llama.cpp's converters read.
//
// Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes
// of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data; offsets are relative to the
// end of the header. Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fsdp/io/files.h"

namespace fsdp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any device; contiguous copies are taken on the CPU) to `path` in the order
// given, with optional string metadata, flushed to the disk. Throws InvalidArgument for a
// duplicate or empty name or an unsupported dtype, IoError when the file cannot be written.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Writes a safetensors file one tensor at a time: the header (every name, dtype and shape)
// first, then each tensor's data in the same order, so the caller holds one tensor at a time.
class SafetensorsWriter {
 public:
  struct Spec {
    std::string name;
    at::ScalarType dtype;
    std::vector<int64_t> shape;
  };
  // Opens `path` and writes the header. InvalidArgument for an empty, reserved or repeated
  // name or an unsupported dtype; IoError when the file cannot be written.
  SafetensorsWriter(const std::string& path, std::vector<Spec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  // The next tensor's data (any device); its dtype and shape must be the spec's.
  void write_next(const at::Tensor& tensor);
  // Flushes to the disk (fsync) and closes; Error when a tensor is missing, IoError when a
  // write failed. The file is complete only then: write it under a staging name and
  // io::publish it (export_safetensors does).
  void finish();

 private:
  // After the specs were checked and the header made: the file is created only then.
  SafetensorsWriter(const std::string& path, const std::string& header, std::vector<Spec>&& specs);

  std::vector<Spec> specs_;
  size_t next_ = 0;
  io::FileWriter out_;
};

// Reads every tensor of `path` into CPU memory, in the file's data order. Throws FormatError
// naming the file and the entry for anything malformed: a header length past the end of the
// file, invalid JSON, a missing or unknown dtype, a negative dimension, offsets that do not match
// the shape or leave the data region, a truncated file. `metadata`, when given, receives
// "__metadata__".
NamedTensors read_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);

// Where each tensor of a safetensors file is, without reading any data: checks the header as
// read_safetensors does (FormatError naming the file and the entry), entries in data order.
struct SafetensorsEntry {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t offset;  // of the first byte, from the start of the file
  uint64_t nbytes;
};
struct SafetensorsIndex {
  std::vector<SafetensorsEntry> entries;
  std::map<std::string, std::string> metadata;
};
SafetensorsIndex read_safetensors_index(const std::string& path);

// Rows [row_begin, row_end) of dim 0 of one tensor (a 0-d tensor has one row), reading only
// those bytes.
at::Tensor read_safetensors_rows(const std::string& path, const SafetensorsEntry& entry,
                                 int64_t row_begin, int64_t row_end);

// Copies the tensors of `path` into `module`'s parameters and buffers of the same names (an
// unsharded module, before fully_shard), converting dtype. Every name must match both ways and
// every shape must agree; otherwise InvalidArgument names the first difference, and no parameter
// has been changed.
void load_safetensors_into(torch::nn::Module& module, const std::string& path);

}  // namespace fsdp
