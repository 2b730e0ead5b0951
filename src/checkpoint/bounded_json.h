// JSON text from files is parsed with a nesting limit: nlohmann's parser is iterative, but
// dump(), comparisons and the error messages that print a value recurse once per level,
// so a deeply nested array in a corrupt file would overflow the stack.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kolo/error.h"

namespace kolo::checkpoint::detail {

/// Deepest nesting of arrays and objects accepted in a file's JSON.
inline constexpr int kMaxJsonDepth = 64;

/// Parses `text`; throws FormatError starting with `what` when it is not valid JSON or nests
/// deeper than kMaxJsonDepth.
inline nlohmann::json parseBoundedJson(std::string_view text, const std::string& what) {
  auto limitDepth = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > kMaxJsonDepth)
      KOLO_THROW(FormatError, what, " nests deeper than ", kMaxJsonDepth, " levels");
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limitDepth);
  } catch (const nlohmann::json::exception& e) {
    KOLO_THROW(FormatError, what, " is not valid JSON (", e.what(), ")");
  }
}

}  // namespace kolo::checkpoint::detail
