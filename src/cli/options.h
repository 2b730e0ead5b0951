// Validators for the options of the `kolo` commands, whose messages say what was given and
// what is accepted in the words a user reads ("--workers must be at least 1, got 0"), and
// the failure message that CLI11 prints for every parse error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace kolo::cli {

/// A whole number of at least `min`: "must be at least 1, got 0" / "must be a whole number".
CLI::Validator atLeast(long long min);

/// A finite number above `min` (exclusive): "must be above 0, got -1".
CLI::Validator above(double min);

/// A finite number of at least `min`: "must be at least 0, got -1".
CLI::Validator notBelow(double min);

/// One of `words`: "'resnet' is not accepted: use mlp or cnn".
CLI::Validator oneOf(std::vector<std::string> words);

/// "a, b or c" (`last` joins the last two).
std::string listWords(const std::vector<std::string>& words, const std::string& last = " or ");

/// CLI11's failure message for `app` and its subcommands: "kolo: error: MESSAGE" and where
/// to find the accepted options.
std::string failureMessage(const CLI::App* app, const CLI::Error& error);

}  // namespace kolo::cli
