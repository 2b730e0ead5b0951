// The shared-memory path of a parameter-server connection whose client and server run on one
// host: the client creates one unnamed shared file (comm/shm_file.h) for the gradients it
// pushes and the values it is answered with, the server maps it through /proc/<pid>/fd, and
// the connection's TCP socket then carries only the 40-byte headers, whose order says when the
// bytes are in place. The file never has a name, so no kill of either side leaves it behind.
#pragma once

#include <cstdint>
#include <string>

#include "comm/shm_file.h"

namespace kolo::parallel::ps::detail {

/// One connection's segment: a page holding a cookie, then `elements` f32 gradients (written
/// by the client before a push, read by the server once the push header arrived), then
/// `elements` f32 values (written by the server before its reply, read by the client after).
/// Move-only; unmaps on destruction.
class SharedExchange {
 public:
  /// The client's side: creates the segment, with a random cookie that the server checks.
  /// Throws IoError when shared memory is short (the caller stays on TCP).
  static SharedExchange create(int64_t elements, const std::string& label);
  /// The server's side: maps the segment that process `pid` holds open as descriptor `fd`.
  /// Throws IoError when it cannot be opened or has another size than `elements` call for,
  /// Mismatch when its cookie is not `cookie` (another process's file, as when the pid
  /// belongs to another pid namespace).
  static SharedExchange map(int pid, int fd, int64_t elements, uint64_t cookie);

  SharedExchange() = default;

  bool valid() const { return file_.data() != nullptr; }
  float* gradients() const;
  float* values() const;
  uint64_t cookie() const;
  /// The client's descriptor that the server opens through /proc (-1 once closed).
  int fd() const { return file_.fd(); }
  /// Closes the client's descriptor once the server has answered the offer: from then on only
  /// the two mappings hold the memory, and it goes with the last process that maps it.
  void closeFd() { file_.closeFd(); }

 private:
  static size_t bytesFor(int64_t elements);

  comm::detail::ShmFile file_;
  int64_t elements_ = 0;
};

}  // namespace kolo::parallel::ps::detail
