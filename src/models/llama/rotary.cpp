// The rotary embedding's frequencies and cos/sin tables (rotary.h, llama.h's rotary_cos_sin).
#include "rotary.h"

#include <cmath>

namespace fsdp::models::llama {

// The rotary inverse frequencies, fp32 on the CPU (transformers makes the buffer at
// construction), with the operations transformers 5.24's modeling_rope_utils.py applies, in its
// order, so that the values are the same bits. Python's `s / t` for a number s is
// t.reciprocal() * s (Tensor.__rdiv__), and `s - t` is rsub(t, s).
torch::Tensor rotary_inverse_frequencies(const Config& c) {
  const int64_t dim = c.head_size();
  // compute_default_rope_parameters: 1.0 / (base ** (arange(0, dim, 2, float) / dim)).
  auto exponent = torch::arange(0, dim, 2, torch::kFloat) / dim;
  auto inv_freq = torch::pow(c.rope_theta, exponent).reciprocal();
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "linear") return inv_freq / r.factor;  // _compute_linear_scaling_rope_parameters
  if (r.type != "llama3") return inv_freq;
  // _compute_llama3_parameters.
  const double old_context = static_cast<double>(r.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / r.low_freq_factor;
  const double high_freq_wavelen = old_context / r.high_freq_factor;
  auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / r.factor, inv_freq);
  auto smooth = (wavelen.reciprocal() * old_context - r.low_freq_factor) /
                (r.high_freq_factor - r.low_freq_factor);
  auto smoothed = torch::rsub(smooth, 1) * scaled / r.factor + smooth * scaled;
  auto medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

// LlamaRotaryEmbedding.forward from the frequencies on the activations' device:
// position_ids[..., None].float() * inv_freq, in fp32; attention_scaling is 1.0 for the
// implemented types (a multiplication that changes nothing).
std::pair<torch::Tensor, torch::Tensor> cos_sin_of(const torch::Tensor& inv_freq, int64_t seq,
                                                   torch::ScalarType dtype) {
  auto positions = torch::arange(seq, torch::TensorOptions(torch::kLong).device(inv_freq.device()));
  auto freqs = positions.unsqueeze(0).unsqueeze(-1).to(torch::kFloat) * inv_freq;
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

std::pair<torch::Tensor, torch::Tensor> rotary_cos_sin(const Config& c, int64_t seq,
                                                       torch::ScalarType dtype,
                                                       torch::Device device) {
  return cos_sin_of(rotary_inverse_frequencies(c).to(device), seq, dtype);
}

}  // namespace fsdp::models::llama
