// Parsing what elastic ranks store for each other (record.h).
#include "parallel/elastic/record.h"

#include <algorithm>
#include <charconv>
#include <climits>

#include "kolo/error.h"

namespace kolo::parallel::detail {
namespace {

/// The blank-separated words of `text`.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  size_t at = 0;
  for (;;) {
    at = text.find_first_not_of(" \t\n", at);
    if (at == std::string::npos) return out;
    const size_t end = std::min(text.find_first_of(" \t\n", at), text.size());
    out.push_back(text.substr(at, end - at));
    at = end;
  }
}

/// `word` as a decimal int64 in [least, most], or false.
bool number(const std::string& word, int64_t least, int64_t most, int64_t* value) {
  const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), *value);
  return error == std::errc() && end == word.data() + word.size() && *value >= least &&
         *value <= most;
}

}  // namespace

ElasticRecord parseElasticRecord(const std::string& text, const std::string& where) {
  const std::vector<std::string> parts = words(text);
  ElasticRecord record;
  const auto refuse = [&](const std::string& why) {
    KOLO_THROW(FormatError, "elastic: the membership record ", where, " is '", text.substr(0, 200),
               "', not 'STEP TICKETS MEMBER...' (", why, ")");
  };
  if (parts.size() < 2) refuse("too short");
  if (!number(parts[0], INT64_MIN, INT64_MAX, &record.step)) refuse("the step is not an integer");
  if (!number(parts[1], 0, INT64_MAX, &record.tickets)) refuse("the tickets are not a count");
  for (size_t i = 2; i < parts.size(); ++i) {
    int64_t member = 0;
    if (!number(parts[i], 0, INT_MAX, &member)) refuse("'" + parts[i] + "' is not a rank id");
    record.members.push_back(static_cast<int>(member));
  }
  // Duplicates found by sorting a copy: a search per member would make every survivor of a
  // job of N ranks do N^2 work.
  std::vector<int> sorted = record.members;
  std::sort(sorted.begin(), sorted.end());
  const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
  if (twice != sorted.end()) refuse("rank " + std::to_string(*twice) + " is named twice");
  return record;
}

int64_t parseElasticNumber(const std::string& text, const std::string& where, int64_t least,
                           int64_t most) {
  int64_t value = 0;
  if (!number(text, least, most, &value))
    KOLO_THROW(FormatError, "elastic: ", where, " holds '", text.substr(0, 200),
               "', not an integer in ", least, "..", most);
  return value;
}

}  // namespace kolo::parallel::detail
