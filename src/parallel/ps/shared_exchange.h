// The shared-memory path of a parameter-server connection whose client and server run on one
// host: the client creates one unnamed shared file (comm/shm_file.h) for the gradients it
// pushes and the values it is answered with, the server maps it through /proc/<pid>/fd, and
// the connection's TCP socket then carries only the 40-byte headers, whose order says when the
// bytes are in place. The server's own values live in one more such file, which the clients
// on its host map the same way and read sync replies from (no copy per worker). No file ever
// has a name, so no kill of any side leaves one behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/shm_file.h"
#include "kolo/tensor.h"
#include "parallel/ps/socket.h"
#include "parallel/ps/wire.h"

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

/// A server's values in shared memory: a page holding a cookie, then `elements` f32 values,
/// which are the server's parameter storage itself (its optimizer updates them in place).
/// Clients on its host map the file and, in sync mode, read each round's values straight from
/// it: the server updates them only once every worker has pushed again, which each does only
/// after it has read them. Move-only; unmaps on destruction.
class SharedValues {
 public:
  /// The server's side: creates the file (its descriptor stays open for clients that connect
  /// later) with a random cookie. Throws IoError when shared memory is short.
  static SharedValues create(int64_t elements, const std::string& label);
  /// A client's side: maps the file that server process `pid` holds open as `fd`, read-only
  /// (a worker computing on the values cannot write into the server's). Throws IoError when
  /// it cannot be opened or has another size, Mismatch when its cookie differs.
  static SharedValues map(int pid, int fd, int64_t elements, uint64_t cookie);

  SharedValues() = default;

  bool valid() const { return file_.data() != nullptr; }
  float* values() const;
  uint64_t cookie() const;
  int fd() const { return file_.fd(); }

 private:
  comm::detail::ShmFile file_;
};

/// Makes `parameter` (every handle of it) use the storage of `over`, a tensor of its shape.
void useStorageOf(const Tensor& parameter, const Tensor& over);

/// A server's storage of `elements` values: a new SharedValues file (kept in `*file`) that
/// clients on its host may map, or memory of this process alone when `file` is null or
/// shared memory is short (`*file` null then). Zeros either way.
Tensor serverValues(int64_t elements, const std::string& label,
                    std::shared_ptr<SharedValues>* file);

/// The server's side of a Share request (`request`, its offer still on `socket`): maps the
/// client's segment when the client runs on this host (`hostId`) and exchanges f32 (not
/// `packed`). An invalid result leaves the connection on TCP: a client elsewhere, or one whose
/// segment cannot be mapped. FormatError for an offer of an impossible size.
SharedExchange acceptOffer(Socket& socket, const Header& request, const std::string& hostId,
                           int64_t elements, bool packed, Clock::time_point deadline);
/// Answers a Share request: whether the segment was mapped and, if so and the server keeps its
/// values in `values` (null: it does not), where the client may map them (ValuesOffer).
void answerOffer(Socket& socket, bool shared, const SharedValues* values,
                 Clock::time_point deadline);

/// A contiguous f32 tensor of `shape` over `data`, memory of a mapping that `owner` holds:
/// the tensor and every view of it keep `owner` (and so the mapping) alive.
Tensor tensorOver(std::shared_ptr<const void> owner, float* data, const Shape& shape);

}  // namespace kolo::parallel::ps::detail
