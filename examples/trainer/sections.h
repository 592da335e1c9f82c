// The trainers' flags in sections, and recipes: TOML files of flags in those sections.
//
// Every flag of a trainer belongs to one section (job, model, data, parallelism, optimizer,
// checkpoint, validation, lora, float8, profiling, plan, generation): --help lists the flags by
// section, and a recipe (--recipe FILE.toml) names each flag under its section's table:
//
//   [model]
//   hf-dir = "SmolLM2-135M-Instruct"
//   [parallelism]
//   tp = 2
//
// A flag given on the command line overrides the recipe's value (CLI11's config files). A key
// that is no flag, or stands in another section than its flag's, or outside any section, is
// refused with the recipe's path, the key and the section it belongs in, before anything runs.
// recipes/ holds real ones; tests/examples/recipes.sh parses and validates each.
#pragma once

#include <CLI/CLI.hpp>
#include <map>
#include <string>

namespace trainer {

// A flag's long name without dashes ("hf-dir") -> its section ("model").
using SectionTable = std::map<std::string, std::string>;

// The sections of the flags every trainer shares (add_train_flags), and --recipe's.
const SectionTable& shared_sections();

// Puts every option of `app` in its section by `table` (the program's own flags) and
// shared_sections(), as its CLI11 group (the section's title in --help), and adds --recipe.
// Throws std::logic_error naming a flag in no section: a flag added without one fails every run
// of the program, every test with it, at once.
void use_sections(CLI::App& app, const SectionTable& table);

}  // namespace trainer
