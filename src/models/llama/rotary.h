// The rotary embedding's tables, as transformers 5.24's LlamaRotaryEmbedding makes them: shared
// by the model (model.cpp) and llama.h's rotary_cos_sin.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <utility>

#include "fsdp/models/llama.h"

namespace fsdp::models::llama {

// The inverse frequencies, fp32 on the CPU, with modeling_rope_utils.py's operations in its
// order (default, linear and llama3 scaling), so that the values are the same bits.
torch::Tensor rotary_inverse_frequencies(const Config& c);

// cos and sin [1, seq, head_size] for positions 0..seq-1 from the frequencies (on their
// device), computed in fp32 and cast to `dtype`.
std::pair<torch::Tensor, torch::Tensor> cos_sin_of(const torch::Tensor& inv_freq, int64_t seq,
                                                   torch::ScalarType dtype);

}  // namespace fsdp::models::llama
