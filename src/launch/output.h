// Line-prefixing of rank output for `kolo run`: bytes read from a rank's stdout or stderr
// pipe are cut into lines, and each whole line is written with "[rank R] " in front in a
// single write, so lines of different ranks never interleave mid-line.
#pragma once

#include <cstddef>
#include <string>

namespace kolo::parallel::detail {

class LinePrefixer {
 public:
  /// Lines go to file descriptor `fd` with `prefix` in front.
  LinePrefixer(int fd, std::string prefix) : fd_(fd), prefix_(std::move(prefix)) {}

  /// Takes more bytes; writes every line completed by them. A line longer than
  /// kMaxLineBytes is written in pieces of that size, each as its own line.
  void feed(const char* data, size_t size);
  /// Writes the unterminated rest, if any, as a last line (the stream ended).
  void finish();

  static constexpr size_t kMaxLineBytes = 64 * 1024;

 private:
  void emit(const char* data, size_t size);

  int fd_;
  std::string prefix_;
  std::string pending_;
  std::string line_;
};

}  // namespace kolo::parallel::detail
