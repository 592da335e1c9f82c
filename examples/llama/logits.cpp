#include "logits.h"

#include <fmt/format.h>

#include <algorithm>

namespace llama {

void write_logits(const std::string& path, int64_t count, Built& b, const TokenData& val,
                  const fsdp::Distributed& dist) {
  torch::NoGradGuard no_grad;
  const int64_t n = std::min<int64_t>(count, val.count());
  auto logits = b.model->full_logits(b.root(val.windows(0, n).tokens.to(dist.device)))
                    .to(torch::kFloat)
                    .cpu();
  if (dist.group->rank() == 0) {
    fsdp::write_safetensors(path, {{"logits", logits.contiguous()}});
    fmt::print("wrote the logits of {} windows to {}\n", n, path);
  }
}

}  // namespace llama
