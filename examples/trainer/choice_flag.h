// A choice flag (choices.h's enums) on a CLI11 App: apart from choices.h, so that the sources
// that only read the options do not compile CLI11 (about 4.5 s each).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "choices.h"

namespace trainer {

// Adds a choice flag to `app`: its words (only those: CLI11's IsMember names them on a wrong
// one) set `value`, whose word is the default shown.
template <class E>
CLI::Option* add_choice(CLI::App& app, const std::string& flag, E& value, const std::string& help) {
  std::vector<std::string> words;
  for (const auto& [word, v] : choice_words<E>()) words.push_back(word);
  return app
      .add_option_function<std::string>(
          flag,
          [&value](const std::string& word) {
            for (const auto& [w, v] : choice_words<E>()) {
              if (w == word) value = v;
            }
          },
          help)
      ->check(CLI::IsMember(words))
      ->default_str(name(value));
}

}  // namespace trainer
