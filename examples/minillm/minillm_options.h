// Command-line options of train_minillm (and of fsdp_plan minillm, which plans its runs): the
// model's sizes and presets, its data and weights, and the training loop's flags
// (trainer/train_options.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "fsdp/models/minillm.h"
#include "train_options.h"
#include "trainer_plan.h"

namespace minillm {

struct Options {
  std::string preset = "cpu-small";
  fsdp::models::minillm::Config model;
  trainer::TrainOptions train;
  std::string data = "auto";  // auto | synthetic | PATH
  std::string init_from;      // safetensors file with the initial weights (PyTorch's names)
  std::string export_path;    // safetensors file of the trained model
  trainer::Dtype export_dtype = trainer::Dtype::fp32;
};

// What parse_options decided: run with `options`, or exit with `exit_code` after printing
// `message` (help text or the error, naming the flag and what is expected).
struct ParseResult {
  std::optional<Options> options;
  int exit_code = 0;
  std::string message;
  std::string notice;  // deprecation lines (train_minillm --plan's)
};

// Parses argv. Presets fill every size flag the user did not give. `world_size` (from the
// launch environment) is needed to check that the global batch splits over the ranks.
ParseResult parse_options(int argc, char** argv, int world_size);

// `fsdp_plan minillm`'s flags: train_minillm's without --plan (the options always plan). Like
// train_minillm --plan, it checks no file the flags name (--data, --init-from).
ParseResult parse_plan_options(int argc, char** argv, int world_size);

// What the planner needs of the model `o` describes (trainer_plan.h). The result refers to `o`,
// which must outlive it.
trainer::PlanModel plan_model(const Options& o);

// The text file `--data auto` reads: present on every Debian machine (package base-files).
inline constexpr const char* kDefaultTextPath = "/usr/share/common-licenses/GPL-3";

}  // namespace minillm
