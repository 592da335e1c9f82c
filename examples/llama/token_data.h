// A token file (nanoGPT's raw format, fsdp/data/token_file.h) as the training loop's data: the
// global batch of each step, and validation windows, with a loss mask when one is given.
#pragma once

#include <fmt/format.h>

#include <string>

#include "data.h"
#include "fsdp/data/token_file.h"
#include "llama_options.h"

namespace llama {

class TokenData final : public trainer::Dataset, public trainer::Windows {
 public:
  TokenData(const std::string& path, const Options& o, int64_t vocab,
            const std::string& loss_mask = "")
      : file_(path, fsdp::data::TokenFileOptions{fsdp::data::parse_token_dtype(o.tokens_dtype),
                                                 vocab, o.train.seq, o.train.seed,
                                                 /*scan_at_open=*/true, loss_mask}),
        mask_(loss_mask) {}
  trainer::Batch slice(int step, int64_t first, int64_t count) const override {
    auto b = file_.batch(step, first, count);
    return {b.inputs, b.targets};
  }
  int64_t count() const override { return file_.val_window_count(); }
  trainer::Batch windows(int64_t first, int64_t n) const override {
    auto b = file_.val_batch(first, n);
    return {b.inputs, b.targets};
  }
  std::string describe() const override {
    return fmt::format("{} ({} tokens{})", file_.path(), file_.size(),
                       mask_.empty() ? "" : ", loss mask " + mask_);
  }

 private:
  fsdp::data::TokenFile file_;
  std::string mask_;
};

}  // namespace llama
