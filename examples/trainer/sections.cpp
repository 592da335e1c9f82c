#include "sections.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>
#include <vector>

namespace trainer {
namespace {

// The sections and their titles (--help lists the groups in the order the flags were added).
const std::vector<std::pair<std::string, std::string>>& section_titles() {
  static const std::vector<std::pair<std::string, std::string>> titles = {
      {"job", "Job"},
      {"model", "Model"},
      {"data", "Data"},
      {"parallelism", "Parallelism and memory"},
      {"optimizer", "Optimizer and schedule"},
      {"checkpoint", "Checkpoints and export"},
      {"validation", "Validation"},
      {"lora", "LoRA"},
      {"float8", "float8"},
      {"profiling", "Profiling"},
      {"plan", "Planning"},
      {"generation", "Generation"},
  };
  return titles;
}

std::string title_of(const std::string& section) {
  for (const auto& [name, title] : section_titles()) {
    if (name == section) return title;
  }
  throw std::logic_error(fmt::format("section '{}' is not one of the trainers' sections", section));
}

// A flag's long name without dashes ("hf-dir") -> its section ("model").
using SectionTable = std::map<std::string, std::string>;

// CLI11's TOML reader with the sections checked and then dropped: CLI11 reads a table as a
// subcommand's flags, while a trainer's sections are one flat set of flags.
class SectionedToml : public CLI::ConfigTOML {
 public:
  explicit SectionedToml(SectionTable sections) : sections_(std::move(sections)) {}

  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    auto items = CLI::ConfigTOML::from_config(input);
    std::vector<CLI::ConfigItem> flat;
    for (auto& item : items) {
      if (item.name == "++" || item.name == "--") continue;  // CLI11's table open/close marks
      const std::string section = fmt::format("{}", fmt::join(item.parents, "."));
      const auto found = sections_.find(item.name);
      if (found == sections_.end()) {
        throw CLI::ValidationError(
            "--recipe", fmt::format("'{}'{} is not a flag of this program (--help lists them)",
                                    item.name, section.empty() ? "" : " in [" + section + "]"));
      }
      if (section != found->second) {
        throw CLI::ValidationError(
            "--recipe", fmt::format("'{}' belongs in [{}]{}", item.name, found->second,
                                    section.empty() ? " (every key stands in its section's table)"
                                                    : fmt::format(", not [{}]", section)));
      }
      item.parents.clear();
      flat.push_back(std::move(item));
    }
    return flat;
  }

 private:
  SectionTable sections_;
};

}  // namespace

void add_section(CLI::App& app, const std::string& name, const std::function<void()>& add) {
  const std::string title = title_of(name);
  const size_t before = app.get_options().size();
  add();
  const auto options = app.get_options();
  for (size_t i = before; i < options.size(); ++i) options[i]->group(title);
}

void use_sections(CLI::App& app) {
  app.set_config("--recipe", "",
                 "A recipe: a TOML file of this program's flags in tables named by their "
                 "sections ([model], [data], [parallelism], ...; recipes/ has examples); a flag "
                 "given on the command line overrides the recipe's")
      ->group(title_of("job"));
  SectionTable table;
  std::vector<std::string> missing;
  for (CLI::Option* option : app.get_options()) {
    if (option == app.get_help_ptr() || option->get_lnames().empty()) continue;
    const auto& name = option->get_lnames().front();
    const auto section =
        std::find_if(section_titles().begin(), section_titles().end(),
                     [&](const auto& s) { return s.second == option->get_group(); });
    if (section == section_titles().end()) {
      missing.push_back("--" + name);
      continue;
    }
    table[name] = section->first;
  }
  if (!missing.empty()) {
    throw std::logic_error(fmt::format("flags in no section (examples/trainer/sections.h): {}",
                                       fmt::join(missing, ", ")));
  }
  app.config_formatter(std::make_shared<SectionedToml>(std::move(table)));
}

}  // namespace trainer
