// parseByteSize: digits, an optional fraction, a binary suffix; exact in integers, so a
// size that does not fit is refused instead of wrapping.
#include "kolo/byte_size.h"

#include <cctype>
#include <cmath>
#include <limits>

#include "kolo/error.h"

namespace kolo {
namespace {

[[noreturn]] void refuse(const std::string& text, const char* why) {
  KOLO_THROW(InvalidArgument, "size '", text, "' is not accepted: ", why);
}

bool isDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

}  // namespace

size_t parseByteSize(const std::string& text) {
  const char* kUse = "use bytes or a number with K, M or G (e.g. 4096, 64K, 1.5G)";
  size_t pos = 0;
  while (pos < text.size() && isDigit(text[pos])) ++pos;
  if (pos == 0) refuse(text, kUse);
  const std::string whole = text.substr(0, pos);
  std::string fraction;
  if (pos < text.size() && text[pos] == '.') {
    const size_t start = ++pos;
    while (pos < text.size() && isDigit(text[pos])) ++pos;
    fraction = text.substr(start, pos - start);
    if (fraction.empty()) refuse(text, kUse);
  }

  std::string suffix = text.substr(pos);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (suffix.size() >= 3 && suffix.compare(suffix.size() - 2, 2, "IB") == 0) suffix.resize(suffix.size() - 2);
  else if (suffix.size() >= 1 && suffix.back() == 'B') suffix.pop_back();
  unsigned shift = 0;
  if (suffix == "K") shift = 10;
  else if (suffix == "M") shift = 20;
  else if (suffix == "G") shift = 30;
  else if (!suffix.empty()) refuse(text, kUse);

  // The whole part in integers (checked), the fraction's share of the unit rounded down.
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  size_t value = 0;
  for (char c : whole) {
    const size_t digit = static_cast<size_t>(c - '0');
    if (value > (kMax - digit) / 10) refuse(text, "more bytes than a size_t holds");
    value = value * 10 + digit;
  }
  if (value > (kMax >> shift)) refuse(text, "more bytes than a size_t holds");
  value <<= shift;
  if (!fraction.empty()) {
    const long double share = std::stold("0." + fraction) * static_cast<long double>(size_t{1} << shift);
    const size_t extra = static_cast<size_t>(std::floor(share));
    if (value > kMax - extra) refuse(text, "more bytes than a size_t holds");
    value += extra;
  }
  return value;
}

}  // namespace kolo
