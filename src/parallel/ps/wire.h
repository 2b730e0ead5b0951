// The parameter-server wire format. Every message is a fixed 40-byte header, then `payload`
// bytes: f32 values of a server's slices (in Placement order), a token, a text or a few
// numbers, as the operation says. The first message on a connection is Hello with the job
// token; nothing else is served before it. Lengths are checked against what the operation
// can carry before anything is allocated (the peer's bytes are untrusted).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "parallel/ps/socket.h"

namespace kolo::parallel::ps::detail {

inline constexpr uint32_t kMagic = 0x3153504b;  // "KPS1" read as little-endian u32
inline constexpr uint64_t kMaxTokenBytes = 1024;
inline constexpr uint64_t kMaxTextBytes = 64 * 1024;
/// Worker indices a server and a dispatcher accept: 0 .. kMaxWorkers - 1.
inline constexpr uint32_t kMaxWorkers = 4096;
/// How long a server's or dispatcher's loop waits for a socket before it checks whether it
/// should stop.
inline constexpr auto kPollSlice = std::chrono::milliseconds(100);

/// Requests. Hello: index = worker index, a = ClientRole (0 worker, 1 chief), payload = token.
/// Pull: -. Push: a = the version the gradients were computed on, payload = gradients.
/// Leave: -. Stats: -. Shutdown: -. Next (dispatcher): a = unit done (-1: none), b = its
/// batches, payload = its loss sum (f64).
/// Checkpoint: payload = the file to write. Restore (the chief, with no push in flight):
/// payload = a file Checkpoint wrote (for this server's index and placement) to load.
/// Heartbeat (worker to the chief, on a connection of its own whose Hello has a = 2): -.
/// Drop (the chief to a server): index = a worker declared lost; it leaves the job for good.
/// Share (a client on the server's host, right after Hello): a = its pid, b = the descriptor
/// of its segment (shared_exchange.h), payload = the segment's cookie (u64) and then the
/// client's host id. The reply's `a` is 1 when the server mapped the segment: from then on
/// the connection's pushes carry no payload (the gradients are in the segment) and its values
/// replies carry none either (the values are); 0 leaves the connection as it was. With a = 1
/// the reply's payload is a ValuesOffer when the server keeps its values in shared memory
/// (empty otherwise); a client that maps that file sets kReadsSharedValues in its pushes'
/// flags, and a sync reply with b = 1 then says the values are to be read there, not in the
/// segment (a Pull's reply and async/ssp replies always put them in the segment).
enum class Op : uint32_t {
  Hello = 1,
  Pull = 2,
  Push = 3,
  Leave = 4,
  Stats = 5,
  Shutdown = 6,
  Next = 7,
  Checkpoint = 8,
  Heartbeat = 9,
  Drop = 10,
  Share = 11,
  Restore = 12
};

/// Where a server keeps its values in shared memory: its pid and the descriptor to open
/// through /proc, and the file's cookie (shared_exchange.h, SharedValues).
struct ValuesOffer {
  int64_t pid = 0;
  int64_t fd = -1;
  uint64_t cookie = 0;
};

/// A Push's flag: the client has mapped the server's values (ValuesOffer).
inline constexpr uint32_t kReadsSharedValues = 1;

/// Hello's `a` of a worker's heartbeat connection to the chief (0 and 1 are ClientRole).
inline constexpr int64_t kHeartbeatHello = 2;

/// Replies, in Header::op. Ok: a = version (servers) or unit id (Next), b = elements (Hello)
/// or epoch (Next); payload = values, stats (10 x i64) or the unit's [begin, end) (2 x i64).
/// Error: payload = the message. Wait: no unit free now. Finished: the job has no more units.
enum class Status : uint32_t { Ok = 0, Error = 1, Wait = 2, Finished = 3 };

struct Header {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint32_t index = 0;
  uint32_t flags = 0;
  int64_t a = 0;
  int64_t b = 0;
  uint64_t payload = 0;
};
static_assert(sizeof(Header) == 40);

inline Header request(Op op, int64_t a = 0, int64_t b = 0, uint64_t payload = 0) {
  Header h;
  h.op = static_cast<uint32_t>(op);
  h.a = a;
  h.b = b;
  h.payload = payload;
  return h;
}

inline Header reply(Status status, int64_t a = 0, int64_t b = 0, uint64_t payload = 0) {
  Header h;
  h.op = static_cast<uint32_t>(status);
  h.a = a;
  h.b = b;
  h.payload = payload;
  return h;
}

/// Receives one header; FormatError naming the peer when its magic is wrong.
Header recvHeader(Socket& socket, Clock::time_point deadline, const char* what);

/// Sends an Error reply with `message` (best effort: a peer that is gone is ignored).
void sendError(Socket& socket, const std::string& message, Clock::time_point deadline);

/// Reads the text of an Error reply whose header was `h` and throws PeerError carrying it.
[[noreturn]] void throwRemoteError(Socket& socket, const Header& h, Clock::time_point deadline);

/// Receives the payload of a Push (`request`) of `elements` gradients into `gradient`
/// (resized), through `packed` when they come as fp16 (scaled by 2^request.b) or bf16;
/// returns gradient.data(). FormatError for an fp16 scale out of range.
float* recvGradients(Socket& socket, const Header& request, bool fp16, bool bf16,
                     int64_t elements, std::vector<uint16_t>& packed,
                     std::vector<float>& gradient, Clock::time_point deadline);

/// Sends Hello with the token and reads the reply; returns it (Ok) or throws PeerError with the
/// peer's reason.
/// `flags` carries the client's Compression.
Header hello(Socket& socket, uint32_t index, int64_t role, const std::string& token,
             Clock::time_point deadline, uint32_t flags = 0);

/// The server side of Hello: reads it (waiting until `deadline`), checks magic and token.
/// Returns the header, or throws FormatError/PeerError (after telling the peer why).
Header acceptHello(Socket& socket, const std::string& token, Clock::time_point deadline);

// The checks of what a peer's header announces, made before any payload is read or any
// state is touched (apart from sockets, so that tests and fuzz/ps_wire_fuzz.cc drive them).

/// A server's check of a request after Hello: a known operation whose payload is what it
/// carries (`pushBytes` for a push on this connection, a path or a share offer of bounded
/// size, nothing for the rest). FormatError naming `peer` and `server` otherwise.
void checkServerRequest(const Header& request, uint64_t pushBytes, const std::string& peer,
                        const std::string& server);

/// How many updates a push computed on version `basis` is behind `version`, the server's.
/// FormatError naming `peer` and `server` when `basis` is no version the server has had
/// (negative, or ahead of it).
int64_t stalenessOf(int64_t version, int64_t basis, const std::string& peer,
                    const std::string& server);

/// The chief's check of a unit request (Next): its payload is the loss sum (one f64), `a`
/// the unit reported done (-1: none), which must be `held`, the unit the worker holds, and
/// `b` that unit's batches, at most one per sample (`unitSamples` in a unit). FormatError
/// naming `peer` otherwise.
void checkUnitRequest(const Header& request, int64_t held, int64_t unitSamples,
                      const std::string& peer);

/// A worker's check of the chief's Ok answer to a unit request: unit `a` >= 0 of epoch
/// `b` >= 0, whose samples [range[0], range[1]) are a range of non-negative indices.
/// FormatError naming `peer` otherwise.
void checkUnitReply(const Header& answer, const int64_t range[2], const std::string& peer);

}  // namespace kolo::parallel::ps::detail
