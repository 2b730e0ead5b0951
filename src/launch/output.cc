// LinePrefixer: cuts rank output into lines and writes each with its rank prefix.
#include "launch/output.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kolo::parallel::detail {

void LinePrefixer::feed(const char* data, size_t size) {
  while (size > 0) {
    const void* newline = std::memchr(data, '\n', size);
    size_t take =
        newline ? static_cast<size_t>(static_cast<const char*>(newline) - data) + 1 : size;
    pending_.append(data, take);
    data += take;
    size -= take;
    if (newline) {
      emit(pending_.data(), pending_.size() - 1);
      pending_.clear();
    }
    while (pending_.size() >= kMaxLineBytes) {
      emit(pending_.data(), kMaxLineBytes);
      pending_.erase(0, kMaxLineBytes);
    }
  }
}

void LinePrefixer::finish() {
  if (!pending_.empty()) emit(pending_.data(), pending_.size());
  pending_.clear();
}

void LinePrefixer::emit(const char* data, size_t size) {
  line_.assign(prefix_);
  line_.append(data, size);
  line_.push_back('\n');
  size_t done = 0;
  while (done < line_.size()) {
    ssize_t n = ::write(fd_, line_.data() + done, line_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // our own stdout is gone (EPIPE): drop the output, keep running the job
    done += static_cast<size_t>(n);
  }
}

}  // namespace kolo::parallel::detail
