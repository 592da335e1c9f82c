// safetensors files: the weights format PyTorch, Hugging Face, MLX and llama.cpp's converters read.
//
// Layout (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes
// of JSON {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {"key": "value"}}, then the raw little-endian data; offsets are relative to the
// end of the header. Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

// Writes `tensors` (any device; contiguous copies are taken on the CPU) to `path` in the order
// given, with optional string metadata. Throws InvalidArgument for a duplicate or empty name or
// an unsupported dtype, Error when the file cannot be written.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor of `path` into CPU memory, in the file's data order. Throws FormatError
// naming the file and the entry for anything malformed: a header length past the end of the
// file, invalid JSON, a missing or unknown dtype, a negative dimension, offsets that do not match
// the shape or leave the data region, a truncated file. `metadata`, when given, receives
// "__metadata__".
NamedTensors read_safetensors(const std::string& path,
                              std::map<std::string, std::string>* metadata = nullptr);

// Copies the tensors of `path` into `module`'s parameters and buffers of the same names (an
// unsharded module, before fully_shard), converting dtype. Every name must match both ways and
// every shape must agree; otherwise InvalidArgument names the first difference, and no parameter
// has been changed.
void load_safetensors_into(torch::nn::Module& module, const std::string& path);

}  // namespace fsdp
