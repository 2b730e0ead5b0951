// printf's formatting into a std::string, for the lines the library hands its callers to
// print (kolo bench's table, the per-rank report).
#pragma once

#include <cstdio>
#include <string>

namespace kolo::detail {

/// `format` with `args` as std::snprintf writes them.
template <class... Args>
std::string printfText(const char* format, Args... args) {
  const int size = std::snprintf(nullptr, 0, format, args...);
  std::string text(static_cast<size_t>(size > 0 ? size : 0), '\0');
  std::snprintf(text.data(), text.size() + 1, format, args...);
  return text;
}

}  // namespace kolo::detail
