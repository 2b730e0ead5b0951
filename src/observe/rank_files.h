// The per-rank files the ranks leave in a directory (trace.rank3.json, flight.rank0.json):
// recognising their names.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kolo::observe::detail {

/// The rank R of a file named PREFIX + R + SUFFIX (R decimal digits, at most 9), or none.
inline std::optional<int> rankOfFile(std::string_view file, std::string_view prefix, std::string_view suffix) {
  if (file.size() <= prefix.size() + suffix.size() || !file.starts_with(prefix) || !file.ends_with(suffix))
    return std::nullopt;
  const std::string_view digits = file.substr(prefix.size(), file.size() - prefix.size() - suffix.size());
  if (digits.size() > 9) return std::nullopt;
  int rank = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    rank = rank * 10 + (c - '0');
  }
  return rank;
}

}  // namespace kolo::observe::detail
