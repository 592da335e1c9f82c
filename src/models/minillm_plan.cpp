#include "fsdp/models/minillm_plan.h"

namespace fsdp::models::minillm {

int64_t block_activation_bytes(const Config& c, int64_t tokens, int64_t seq, int compute_bytes) {
  const int64_t nd = tokens * c.dim;
  const int64_t batch = tokens / seq;
  // Measured with the counting CPU allocator (tests/tools/test_planner.cpp holds the count to 1%
  // at several shapes), for N tokens of width d:
  //   x + attn(norm1(x)):  7 Nd in fp32: the normalised input and its 1/rms (N, fp32), the
  //                        packed q, k, v (3 Nd), the attention's output and the heads merged
  //                        for the output projection, the residual sum; plus the attention's
  //                        log-sum-exp (batch x heads x seq, fp32);
  //   y + ffn(norm2(y)):  11 Nd: the normalised input and its 1/rms, fc1's output and SiLU's
  //                        (4 Nd each: SiLU's input and fc2's), the block's output.
  // In bf16, rms_norm computes in fp32 and keeps fp32 copies of its input: 10 more bytes per
  // element of Nd over the 18 Nd in bf16 (the allocator's figure: 46 bytes per Nd).
  const int64_t per_nd = compute_bytes == 2 ? 46 : 18 * compute_bytes;
  return nd * per_nd + 2 * tokens * 4 + batch * c.heads * seq * 4;
}

int64_t root_activation_bytes(const Config& c, int64_t tokens, int compute_bytes) {
  // The embedding's output (Nd), the head's logits (N V) and the loss's fp32 log-probabilities.
  return tokens * c.dim * compute_bytes + tokens * c.output_size() * (compute_bytes + 4);
}

int64_t loss_transient_bytes(const Config& c, int64_t tokens) {
  return 2 * tokens * c.output_size() * 4;
}

std::vector<fsdp::plan::UnitSpec> plan_units(const PlanShape& s) {
  const Config& c = s.model;
  const int64_t tokens = s.batch_per_rank * s.seq;
  std::vector<fsdp::plan::UnitSpec> units;
  fsdp::plan::UnitSpec root;
  root.name = "(root)";
  root.params.push_back({c.vocab, c.dim});
  if (!c.tie_embeddings) root.params.push_back({c.output_size(), c.dim});
  root.activation_bytes = root_activation_bytes(c, tokens, s.compute_bytes);
  root.reshard_after_forward = false;
  units.push_back(root);
  for (int64_t i = 0; i < c.layers; ++i) {
    fsdp::plan::UnitSpec b;
    b.name = "layers." + std::to_string(i);
    const int64_t d = c.dim;
    b.params = {{d, 1},     {d, 1},       // norm1, norm2
                {3 * d, d}, {3 * d, 1},   // in_proj weight and bias
                {d, d},     {d, 1},       // out_proj
                {4 * d, d}, {d, 4 * d}};  // fc1, fc2
    b.activation_bytes = block_activation_bytes(c, tokens, s.seq, s.compute_bytes);
    b.checkpointed = s.activation_checkpointing;
    b.checkpoint_input_bytes = tokens * d * s.compute_bytes;  // its input, kept for the recompute
    units.push_back(b);
  }
  return units;
}

}  // namespace fsdp::models::minillm
