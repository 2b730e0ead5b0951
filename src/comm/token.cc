// Random bytes and hex text (token.h).
#include "comm/token.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kolo/error.h"

namespace kolo::comm::detail {

void randomBytes(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = ::getrandom(p + got, bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) KOLO_THROW(IoError, "getrandom failed: ", std::strerror(errno));
    got += static_cast<size_t>(n);
  }
}

std::string hexText(const void* data, size_t bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* p = static_cast<const uint8_t*>(data);
  std::string text;
  text.reserve(2 * bytes);
  for (size_t i = 0; i < bytes; ++i) {
    text += kDigits[p[i] >> 4];
    text += kDigits[p[i] & 15];
  }
  return text;
}

std::string randomToken(size_t bytes) {
  std::vector<uint8_t> raw(bytes);
  randomBytes(raw.data(), bytes);
  return hexText(raw.data(), bytes);
}

}  // namespace kolo::comm::detail
