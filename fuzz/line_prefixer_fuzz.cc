// kolo run's cutting of a rank's output into prefixed lines (src/launch/output.cc): the
// bytes a rank writes to its stdout or stderr, fed in pieces as reads of its pipe return
// them. The first byte sets the piece size (1 to 256 bytes); the rest is the output. What
// comes out (into a memory file) is lines that each start with the prefix, none longer than
// the prefix and kMaxLineBytes, whose texts put together are the output without its newlines.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "launch/output.h"

using kolo::parallel::detail::LinePrefixer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = static_cast<size_t>(data[0]) + 1;
  const char* output = reinterpret_cast<const char*>(data) + 1;
  const size_t length = size - 1;
  const int fd = ::memfd_create("line_prefixer_fuzz", MFD_CLOEXEC);
  if (fd < 0) return 0;
  const std::string prefix = "[rank 3] ";
  {
    LinePrefixer lines(fd, prefix);
    for (size_t at = 0; at < length; at += piece) lines.feed(output + at, std::min(piece, length - at));
    lines.finish();
  }
  std::string written(static_cast<size_t>(::lseek(fd, 0, SEEK_CUR)), '\0');
  KOLO_FUZZ_REQUIRE(::pread(fd, written.data(), written.size(), 0) == static_cast<ssize_t>(written.size()));
  ::close(fd);
  std::string texts;
  for (size_t at = 0; at < written.size();) {
    const size_t end = written.find('\n', at);
    KOLO_FUZZ_REQUIRE(end != std::string::npos);
    KOLO_FUZZ_REQUIRE(written.compare(at, prefix.size(), prefix) == 0);
    KOLO_FUZZ_REQUIRE(end - at - prefix.size() <= LinePrefixer::kMaxLineBytes);
    texts.append(written, at + prefix.size(), end - at - prefix.size());
    at = end + 1;
  }
  std::string expected(output, length);
  expected.erase(std::remove(expected.begin(), expected.end(), '\n'), expected.end());
  KOLO_FUZZ_REQUIRE(texts == expected);
  return 0;
}
