// The logits of train_llama's model, for the tests to compare: the first COUNT validation windows
// of --val-tokens, through the model train_llama builds from the same flags (sharded over the
// launched ranks, split under --tp, float8 or LoRA as given), written by rank 0 to OUT (tensor
// "logits", fp32, the whole vocabulary gathered under --tp). What train_llama --dump-logits did
// (deprecated there): a test aid, not a user's job.
//   llama_dump_logits OUT.safetensors COUNT TRAIN_LLAMA_FLAGS...   (--val-tokens needed)
// Launched like train_llama: alone, under mpirun, torchrun or scripts/launch.sh.
#include <fmt/format.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "fsdp/fsdp.h"
#include "llama_build.h"
#include "llama_options.h"
#include "logits.h"
#include "loop.h"
#include "token_data.h"

int main(int argc, char** argv) {
  int64_t count = 0;
  if (argc >= 3) count = std::atoll(argv[2]);
  if (argc < 3 || count < 1) {
    fmt::print(stderr,
               "usage: llama_dump_logits OUT.safetensors COUNT TRAIN_LLAMA_FLAGS... (COUNT: the "
               "validation windows to write, at least 1; --val-tokens FILE among the flags)\n");
    return 2;
  }
  const std::string out = argv[1];
  // train_llama's own parse, as an evaluation: the same flags mean the same model.
  std::vector<char*> args = {argv[0]};
  for (int i = 3; i < argc; ++i) args.push_back(argv[i]);
  std::string eval_only = "--eval-only";
  args.push_back(eval_only.data());
  llama::Options options;
  return trainer::trainer_main(
      static_cast<int>(args.size()), args.data(),
      trainer::parse_into(options, llama::parse_options), [] { return 2; },
      [&](const fsdp::LaunchInfo& launch) {
        auto dist = trainer::start_job(options.train, launch);
        const auto mesh =
            fsdp::make_device_mesh(dist.group, options.train.replicas, options.train.tp);
        auto built = llama::build(options, dist, mesh);
        const llama::TokenData val(options.val_tokens, options, built.config.vocab_size,
                                   options.val_loss_mask);
        llama::write_logits(out, count, built, val, dist);
        return 0;
      });
}
