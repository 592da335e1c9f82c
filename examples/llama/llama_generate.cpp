// llama_generate: generation with a Llama-family model (Hugging Face weights, a PEFT adapter on
// them if given), after prompt token ids, or a text through the model's tokenizer and, with
// --chat, its chat template. Launched like the trainer, every rank holds its shards and gathers
// the layers as in training (--tp splits them), and all draw the same tokens; rank 0 prints.
// It takes the generation flags train_llama took (deprecated there). See README.md beside it.
#include <fmt/format.h>

#include "generation.h"
#include "llama_build.h"
#include "llama_options.h"
#include "loop.h"

int main(int argc, char** argv) {
  llama::Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, llama::parse_generate_options),
      [] { return 0; },  // no --plan here
      [&](const fsdp::LaunchInfo& launch) {
        auto dist = trainer::start_job(options.train, launch);
        const auto mesh = fsdp::make_device_mesh(dist.group, 1, options.train.tp);
        auto built = llama::build(options, dist, mesh);
        return llama::generate(options, built, dist);
      });
}
