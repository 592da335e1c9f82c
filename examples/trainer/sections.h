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

#include <functional>
#include <string>

namespace CLI {  // <CLI/CLI.hpp>, included by the sources that add or parse flags
class App;
}  // namespace CLI

namespace trainer {

// Registers one section's flags: every option `add` puts on `app` joins the section `name` (job,
// model, data, parallelism, optimizer, checkpoint, validation, lora, float8, profiling, plan or
// generation): its title is their group in --help, its name their table in a recipe. Throws
// std::logic_error for a name that is no section.
void add_section(CLI::App& app, const std::string& name, const std::function<void()>& add);

// Adds --recipe (to [job]) and reads recipes by the sections the flags joined. Throws
// std::logic_error naming every flag added outside add_section: a flag without a section fails
// every run of the program, every test with it, at once.
void use_sections(CLI::App& app);

}  // namespace trainer
