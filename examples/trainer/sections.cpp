#include "sections.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <stdexcept>
#include <vector>

namespace trainer {
namespace {

// The sections in --help's order, with their titles.
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

const SectionTable& shared_sections() {
  static const SectionTable table = {
      {"recipe", "job"},
      {"seed", "job"},
      {"threads", "job"},
      {"comm-timeout", "job"},
      {"metrics-out", "job"},
      {"nonfinite", "job"},
      {"dtype", "model"},
      {"fused-loss", "model"},
      {"loss-chunk", "model"},
      {"activation-checkpointing", "parallelism"},
      {"init-full-model", "parallelism"},
      {"no-reshard-after-forward", "parallelism"},
      {"offload", "parallelism"},
      {"quantize-all-gather", "parallelism"},
      {"replicas", "parallelism"},
      {"lr", "optimizer"},
      {"warmup", "optimizer"},
      {"lr-schedule", "optimizer"},
      {"lr-min", "optimizer"},
      {"weight-decay", "optimizer"},
      {"beta1", "optimizer"},
      {"beta2", "optimizer"},
      {"optimizer", "optimizer"},
      {"clip-grad-norm", "optimizer"},
      {"grad-accum", "optimizer"},
      {"grad-accum-sync", "optimizer"},
      {"save-dir", "checkpoint"},
      {"save-every", "checkpoint"},
      {"keep", "checkpoint"},
      {"resume", "checkpoint"},
      {"eval-every", "validation"},
      {"eval-only", "validation"},
      {"eval-batch", "validation"},
      {"profile-steps", "profiling"},
      {"profile-dir", "profiling"},
      {"no-profile-shapes", "profiling"},
      {"track-host-memory", "profiling"},
      {"plan", "plan"},
      {"plan-world", "plan"},
      {"plan-ranks-per-host", "plan"},
      {"plan-collectives", "plan"},
      {"plan-links", "plan"},
      {"plan-capacity-gib", "plan"},
      {"plan-json", "plan"},
      {"plan-search", "plan"},
  };
  return table;
}

void use_sections(CLI::App& app, const SectionTable& table) {
  SectionTable all = shared_sections();
  for (const auto& [flag, section] : table) all[flag] = section;
  app.set_config("--recipe", "",
                 "A recipe: a TOML file of this program's flags in tables named by their "
                 "sections ([model], [data], [parallelism], ...; recipes/ has examples); a flag "
                 "given on the command line overrides the recipe's");
  app.config_formatter(std::make_shared<SectionedToml>(all));
  std::vector<std::string> missing;
  for (CLI::Option* option : app.get_options()) {
    if (option == app.get_help_ptr() || option->get_lnames().empty()) continue;
    const auto& name = option->get_lnames().front();
    const auto found = all.find(name);
    if (found == all.end()) {
      missing.push_back("--" + name);
      continue;
    }
    option->group(title_of(found->second));
  }
  if (!missing.empty()) {
    throw std::logic_error(fmt::format("flags in no section (examples/trainer/sections.h): {}",
                                       fmt::join(missing, ", ")));
  }
}

}  // namespace trainer
