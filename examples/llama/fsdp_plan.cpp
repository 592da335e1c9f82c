// fsdp_plan: what a train_llama run needs, without running it: the memory per rank and the
// communication per step (the planner, fsdp/tools/planner.h) for the run train_llama's flags or
// recipe describe, at --plan-world ranks, and with --plan-search the best layouts of that world.
// One process, no launch: the model's config.json (or a --preset) is all it reads. It takes
// what `train_llama --plan` took (deprecated there). See docs/scale.md.
#include "llama_build.h"
#include "llama_options.h"
#include "loop.h"

int main(int argc, char** argv) {
  llama::Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, llama::parse_plan_options),
      [&] { return llama::plan(options); },
      [](const fsdp::LaunchInfo&) { return 0; });  // parse_plan_options always plans
}
