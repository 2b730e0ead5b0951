// JSON string escaping for the recorders that write their JSON by hand (trace.cc,
// flight_recorder.cc: the base layer has no JSON library, and a dump must not allocate much
// while a process is failing).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <string>

namespace kolo::detail {

/// Appends `text` (up to its NUL or `limit` bytes) escaped for a JSON string, without quotes.
inline void appendJsonEscaped(std::string& out, const char* text, size_t limit = SIZE_MAX) {
  for (size_t i = 0; i < limit && text[i] != '\0'; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", c);
      out += code;
    } else {
      out += static_cast<char>(c);
    }
  }
}

}  // namespace kolo::detail
