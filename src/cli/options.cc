// Option validators and the parse-failure message of the `kolo` commands (options.h).
#include "cli/options.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <CLI/CLI.hpp>

namespace kolo::cli {
namespace {

bool parseWhole(const std::string& text, long long& value) {
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  return error == std::errc() && end == text.data() + text.size();
}

bool parseReal(const std::string& text, double& value) {
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return !text.empty() && end == text.c_str() + text.size() && std::isfinite(value);
}

std::string number(double value) {
  std::string text = std::to_string(value);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text;
}

// A number above `min` (`strict`) or at least `min`.
CLI::Validator numberBound(double min, bool strict) {
  const std::string bound = (strict ? "above " : "at least ") + number(min);
  return CLI::Validator(
      [min, strict, bound](std::string& text) -> std::string {
        double value = 0;
        if (!parseReal(text, value)) return "must be a number, got '" + text + "'";
        if (strict ? !(value > min) : value < min) return "must be " + bound + ", got " + text;
        return "";
      },
      (strict ? "NUMBER > " : "NUMBER >= ") + number(min));
}

}  // namespace

CLI::Validator atLeast(long long min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        long long value = 0;
        if (!parseWhole(text, value)) return "must be a whole number, got '" + text + "'";
        if (value < min) return "must be at least " + std::to_string(min) + ", got " + text;
        return "";
      },
      "INT >= " + std::to_string(min));
}

CLI::Validator above(double min) { return numberBound(min, true); }
CLI::Validator notBelow(double min) { return numberBound(min, false); }

std::string listWords(const std::vector<std::string>& words, const std::string& last) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i) out += (i == 0 ? "" : i + 1 == words.size() ? last : ", ") + words[i];
  return out;
}

CLI::Validator oneOf(std::vector<std::string> words) {
  std::string description = "{";
  for (size_t i = 0; i < words.size(); ++i) description += (i ? "," : "") + words[i];
  description += "}";
  return CLI::Validator(
      [words = std::move(words)](std::string& text) -> std::string {
        for (const std::string& word : words) {
          if (text == word) return "";
        }
        return "'" + text + "' is not accepted: use " + listWords(words);
      },
      description);
}

std::string failureMessage(const CLI::App* app, const CLI::Error& error) {
  // CLI11 writes a validator's complaint as "NAME: MESSAGE"; ours read as one sentence
  // once the colon goes ("--workers must be at least 1, got 0").
  std::string message = error.what();
  const size_t colon = message.find(": ");
  if (message.rfind("-", 0) == 0 && colon != std::string::npos &&
      (message.compare(colon + 2, 5, "must ") == 0 || message.compare(colon + 2, 1, "'") == 0))
    message.erase(colon, 1);
  std::string path = app->get_name();
  for (const CLI::App* sub = app; !sub->get_subcommands().empty();) {
    sub = sub->get_subcommands().front();
    path += " " + sub->get_name();
  }
  return "kolo: error: " + message + "\n(`" + path + " --help` lists the options)\n";
}

}  // namespace kolo::cli
