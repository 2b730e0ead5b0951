// The settings registry's table (built from KOLO_SETTINGS), the parsing of each type, the
// suggestion for a misspelt variable, and the typed accessors. The only code of kolo that
// reads the process environment.
#include "kolo/settings.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "base/printf_text.h"
#include "kolo/error.h"

extern char** environ;

namespace kolo::settings {
namespace {

constexpr Declaration kDeclarations[] = {
#define KOLO_SETTING_ENTRY_(accessor, name, kind, fallback, choices, help) \
  {name, Type::kind, fallback, choices, help},
    KOLO_SETTINGS(KOLO_SETTING_ENTRY_)
#undef KOLO_SETTING_ENTRY_
};

// Variables of kolo's scripts (scripts/, bench/), which the program ignores but does not
// warn about when they are exported to it.
constexpr std::string_view kScriptVariables[] = {"KOLO_BENCH_ARGS", "KOLO_SKIP_ASAN",
                                                 "KOLO_WITH_PEERS"};

constexpr std::string_view kPrefix = "KOLO_";

std::string quoted(std::string_view name, const std::string& value) {
  return std::string(name) + "='" + value + "'";
}

// "a|b|c" -> "a, b, c".
std::string listChoices(std::string_view choices) {
  std::string out(choices);
  for (size_t at = out.find('|'); at != std::string::npos; at = out.find('|', at))
    out.replace(at, 1, ", ");
  return out;
}

bool isChoice(std::string_view choices, std::string_view word) {
  size_t begin = 0;
  while (begin <= choices.size()) {
    size_t end = choices.find('|', begin);
    if (end == std::string_view::npos) end = choices.size();
    if (choices.substr(begin, end - begin) == word) return true;
    begin = end + 1;
  }
  return false;
}

size_t editDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitute = previous[j - 1] + (a[i - 1] != b[j - 1]);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitute});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

std::string upper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::span<const Declaration> declarations() { return kDeclarations; }

const Declaration* find(std::string_view name) {
  for (const Declaration& declaration : kDeclarations) {
    if (declaration.name == name) return &declaration;
  }
  return nullptr;
}

const char* typeName(Type type) {
  switch (type) {
    case Type::Flag: return "flag";
    case Type::Integer: return "integer";
    case Type::Seconds: return "seconds";
    case Type::Choice: return "choice";
    case Type::Text: return "text";
    case Type::Secret: return "secret";
  }
  return "?";
}

Environment::Environment(std::map<std::string, std::string> variables)
    : variables_(std::move(variables)) {}

Environment Environment::process() {
  std::map<std::string, std::string> variables;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const std::string_view text(*entry);
    const size_t eq = text.find('=');
    if (eq != std::string_view::npos)
      variables.emplace(std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)));
  }
  return Environment(std::move(variables));
}

const std::string* Environment::find(const std::string& name) const {
  const auto it = variables_.find(name);
  return it == variables_.end() || it->second.empty() ? nullptr : &it->second;
}

const Declaration& Environment::declared(std::string_view name, Type type) const {
  const Declaration* declaration = settings::find(name);
  // Asking for an undeclared name or with the wrong type is a mistake in kolo, not the user's.
  if (declaration == nullptr) KOLO_THROW(Error, "setting ", name, " is not declared in KOLO_SETTINGS");
  if (declaration->type != type && !(type == Type::Text && declaration->type == Type::Secret))
    KOLO_THROW(Error, "setting ", name, " is a ", typeName(declaration->type), ", read as a ",
               typeName(type));
  return *declaration;
}

Source Environment::source(std::string_view name) const {
  if (settings::find(name) == nullptr)
    KOLO_THROW(Error, "setting ", name, " is not declared in KOLO_SETTINGS");
  return find(std::string(name)) ? Source::Environment : Source::Default;
}

std::string Environment::text(std::string_view name) const {
  const Declaration* declaration = settings::find(name);
  if (declaration == nullptr)
    KOLO_THROW(Error, "setting ", name, " is not declared in KOLO_SETTINGS");
  const std::string* value = find(std::string(name));
  return value ? *value : std::string(declaration->defaultValue);
}

bool Environment::flag(std::string_view name) const {
  declared(name, Type::Flag);
  const std::string value = text(name);
  const std::string word = upper(value);
  if (word == "1" || word == "TRUE" || word == "YES" || word == "ON") return true;
  if (word == "0" || word == "FALSE" || word == "NO" || word == "OFF") return false;
  KOLO_THROW(InvalidArgument, quoted(name, value),
             " is not a switch: use 1, true, yes or on, or 0, false, no or off");
}

std::optional<int64_t> Environment::integer(std::string_view name) const {
  declared(name, Type::Integer);
  const std::string value = text(name);
  if (value.empty()) return std::nullopt;
  int64_t number = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), number);
  if (error != std::errc() || end != value.data() + value.size())
    KOLO_THROW(InvalidArgument, quoted(name, value), " is not a whole number");
  return number;
}

std::optional<double> Environment::seconds(std::string_view name) const {
  declared(name, Type::Seconds);
  const std::string value = text(name);
  if (value.empty()) return std::nullopt;
  char* end = nullptr;
  const double number = std::strtod(value.c_str(), &end);
  if (end == value.c_str() || *end != '\0' || !(number > 0) || !std::isfinite(number))
    KOLO_THROW(InvalidArgument, quoted(name, value), " is not a positive number of seconds");
  return number;
}

std::string Environment::choice(std::string_view name) const {
  const Declaration& declaration = declared(name, Type::Choice);
  const std::string value = text(name);
  if (!isChoice(declaration.choices, value))
    KOLO_THROW(InvalidArgument, quoted(name, value), " is not accepted: use one of ",
               listChoices(declaration.choices));
  return value;
}

std::string Environment::problem(std::string_view name) const {
  const Declaration* declaration = settings::find(name);
  KOLO_CHECK(declaration != nullptr, "no setting ", name, " is declared");
  if (text(name).empty()) return "";
  try {
    switch (declaration->type) {
      case Type::Flag: flag(name); break;
      case Type::Integer: integer(name); break;
      case Type::Seconds: seconds(name); break;
      case Type::Choice: choice(name); break;
      case Type::Text:
      case Type::Secret: break;
    }
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

void Environment::validate() const {
  for (const Declaration& declaration : kDeclarations) {
    if (source(declaration.name) == Source::Default) continue;
    const std::string why = problem(declaration.name);
    if (!why.empty()) throw InvalidArgument(why);
  }
}

std::vector<std::string> Environment::unknown() const {
  std::vector<std::string> names;
  for (const auto& [name, value] : variables_) {
    if (name.rfind(kPrefix, 0) != 0 || settings::find(name) != nullptr) continue;
    if (std::find(std::begin(kScriptVariables), std::end(kScriptVariables), name) !=
        std::end(kScriptVariables))
      continue;
    names.push_back(name);
  }
  return names;  // std::map keeps them sorted
}

std::string closestName(std::string_view name) {
  const std::string wanted = upper(name);
  std::string_view best;
  size_t bestDistance = std::string::npos;
  for (const Declaration& declaration : kDeclarations) {
    const size_t distance = editDistance(wanted, declaration.name);
    if (distance < bestDistance) {
      bestDistance = distance;
      best = declaration.name;
    }
  }
  const size_t letters = wanted.size() > kPrefix.size() ? wanted.size() - kPrefix.size() : 1;
  if (bestDistance > std::max<size_t>(2, letters / 3)) return "";
  return std::string(best);
}

std::vector<std::string> unknownVariableWarnings(const Environment& env) {
  std::vector<std::string> lines;
  for (const std::string& name : env.unknown()) {
    const std::string nearest = closestName(name);
    lines.push_back(name + " is not a kolo setting (" +
                    (nearest.empty() ? std::string() : "did you mean " + nearest + "? ") +
                    "`kolo env` lists them)");
  }
  return lines;
}

namespace {

// The value as the listing shows it.
std::string shownValue(const Environment& env, const Declaration& declaration) {
  const std::string text = env.text(declaration.name);
  if (text.empty()) return "(unset)";
  if (declaration.type == Type::Secret) return "(set, hidden)";
  if (declaration.type == Type::Flag && env.problem(declaration.name).empty())
    return env.flag(declaration.name) ? "1" : "0";
  return text;
}

}  // namespace

std::string listing(const Environment& env, bool help) {
  size_t nameWidth = 0, valueWidth = 0;
  for (const Declaration& declaration : declarations()) {
    nameWidth = std::max(nameWidth, declaration.name.size());
    valueWidth = std::max(valueWidth, shownValue(env, declaration).size());
  }
  std::string text;
  for (const Declaration& declaration : declarations()) {
    const bool fromEnvironment = env.source(declaration.name) == Source::Environment;
    text += detail::printfText("%-*s  %-*s  %-11s", static_cast<int>(nameWidth), std::string(declaration.name).c_str(),
                               static_cast<int>(valueWidth), shownValue(env, declaration).c_str(),
                               fromEnvironment ? "environment" : "default");
    if (help) {
      text += "  " + std::string(declaration.help);
      if (!declaration.choices.empty()) {
        std::string choices(declaration.choices);
        std::replace(choices.begin(), choices.end(), '|', ' ');
        text += " [" + choices + "]";
      }
    }
    text += "\n";
    if (const std::string problem = env.problem(declaration.name); !problem.empty())
      text += "  ^ not accepted: " + problem + "\n";
  }
  return text;
}

#define KOLO_SETTING_DEFINITION_(accessor, name, kind, ...) \
  ValueOf<Type::kind>::type accessor(const Environment& env) { return read##kind(env, name); }

namespace {

bool readFlag(const Environment& env, std::string_view name) { return env.flag(name); }
std::optional<int64_t> readInteger(const Environment& env, std::string_view name) {
  return env.integer(name);
}
std::optional<double> readSeconds(const Environment& env, std::string_view name) {
  return env.seconds(name);
}
std::string readChoice(const Environment& env, std::string_view name) { return env.choice(name); }
std::string readText(const Environment& env, std::string_view name) { return env.text(name); }
std::string readSecret(const Environment& env, std::string_view name) { return env.text(name); }

}  // namespace

KOLO_SETTINGS(KOLO_SETTING_DEFINITION_)
#undef KOLO_SETTING_DEFINITION_

}  // namespace kolo::settings
