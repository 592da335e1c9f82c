// fsdp_plan: what a training run needs, without running it: the memory per rank and the
// communication per step (the planner, fsdp/tools/planner.h) for the run a trainer's flags or
// recipe describe, at --plan-world ranks, and with --plan-search the best layouts of that world.
//   fsdp_plan [llama] TRAIN_LLAMA_FLAGS...     a train_llama run (the default)
//   fsdp_plan minillm TRAIN_MINILLM_FLAGS...   a train_minillm run
// One process, no launch: the model's config.json, --preset or sizes are all it reads. It takes
// what `train_llama --plan` and `train_minillm --plan` took (deprecated there). See
// docs/scale.md.
#include <fmt/format.h>

#include <string>
#include <string_view>

#include "llama_build.h"
#include "llama_options.h"
#include "loop.h"
#include "minillm_options.h"

namespace {

// One model's plan: its trainer's flags parsed by `parse` (which always plans), then `plan`.
template <class Options, class Parse, class Plan>
int plan_run(int argc, char** argv, Parse parse, Plan plan) {
  Options options;
  return trainer::trainer_main(
      argc, argv, trainer::parse_into(options, parse), [&] { return plan(options); },
      [](const fsdp::LaunchInfo&) { return 0; });  // never reached: the options always plan
}

int plan_llama(int argc, char** argv) {
  return plan_run<llama::Options>(argc, argv, llama::parse_plan_options, llama::plan);
}

int plan_minillm(int argc, char** argv) {
  return plan_run<minillm::Options>(
      argc, argv, minillm::parse_plan_options,
      [](const minillm::Options& o) { return trainer::run_plan(o.train, minillm::plan_model(o)); });
}

}  // namespace

int main(int argc, char** argv) {
  // The model comes first when named; the flags after it are its trainer's.
  if (argc < 2 || argv[1][0] == '-') return plan_llama(argc, argv);
  const std::string_view model = argv[1];  // views the original argument, which stays
  // The rest parses as the trainer's command line, under the name its usage line shows.
  std::string name = fmt::format("{} {}", argv[0], model);
  argv[1] = name.data();
  if (model == "llama") return plan_llama(argc - 1, argv + 1);
  if (model == "minillm") return plan_minillm(argc - 1, argv + 1);
  fmt::print(stderr,
             "error: fsdp_plan {}: unknown model; expected llama (a train_llama run, the default) "
             "or minillm (a train_minillm run), then that trainer's flags\n",
             model);
  return 2;
}
