// The range of one flag's value, written where the flag is added: CLI11 validators, so that a
// flag lands in one place (its field, and its add_option with help and range) instead of three.
// A value out of range is refused while the command line and the recipe are parsed, before
// anything runs, as "--FLAG: must be >= 0 (0: off), got -1"; the --help line shows the range
// after the type, in CLI11's words ("INT:NONNEGATIVE", "FLOAT:POSITIVE"). The rules between
// flags stay in the trainers' check functions.
//
// Each checks the value as a number; text that is no number passes on to CLI11's conversion,
// which refuses it naming the flag. A number must be finite (no nan, no inf).
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

namespace trainer {

namespace flag_checks_detail {

// `holds(v)` decides; the error is "must be WHAT[NOTE], got TEXT"; --help shows `name`.
template <class Holds>
CLI::Validator number(const std::string& name, const std::string& what, const std::string& note,
                      Holds holds) {
  return CLI::Validator(
      [what, note, holds](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "";
        if (std::isfinite(v) && holds(v)) return "";
        return fmt::format("must be {}{}{}, got {}", std::isfinite(v) ? "" : "a finite number ",
                           what, note, text);
      },
      name);
}

}  // namespace flag_checks_detail

// v >= 0. `note` says what a special value means, e.g. " (0: off)".
inline CLI::Validator non_negative(const std::string& note = "") {
  return flag_checks_detail::number("NONNEGATIVE", ">= 0", note, [](double v) { return v >= 0; });
}

// v > 0.
inline CLI::Validator positive() {
  return flag_checks_detail::number("POSITIVE", "> 0", "", [](double v) { return v > 0; });
}

// min <= v < max: [min, max).
inline CLI::Validator in_half_open(double min, double max) {
  const auto range = fmt::format("in [{}, {})", min, max);
  return flag_checks_detail::number(range, range, "",
                                    [min, max](double v) { return v >= min && v < max; });
}

// min < v <= max: (min, max].
inline CLI::Validator in_open_closed(double min, double max) {
  const auto range = fmt::format("in ({}, {}]", min, max);
  return flag_checks_detail::number(range, range, "",
                                    [min, max](double v) { return v > min && v <= max; });
}

// min <= v <= max: [min, max].
inline CLI::Validator in_closed(double min, double max) {
  const auto range = fmt::format("in [{}, {}]", min, max);
  return flag_checks_detail::number(range, range, "",
                                    [min, max](double v) { return v >= min && v <= max; });
}

}  // namespace trainer
