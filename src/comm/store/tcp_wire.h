// The TCP store's wire format, shared by server and client. Every message is a frame: a
// little-endian u32 body length, then the body. A request body is an opcode byte and its
// fields; byte strings are a u32 length and the bytes; integers are little-endian. A reply
// body is a status byte and the operation's result. The first request on a connection
// must be Hello carrying the magic "KOLO", the protocol version and the job token.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/comm/store.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

inline constexpr uint32_t kTcpStoreMagic = 0x4f4c4f4b;  // "KOLO" read as little-endian u32
inline constexpr uint8_t kTcpStoreVersion = 2;
/// Largest frame a connection may send before it has presented the token.
inline constexpr uint32_t kMaxHelloFrame = 4096 + 64;

enum class StoreOp : uint8_t {
  Hello = 1,
  Set = 2,
  Get = 3,
  Wait = 4,
  Add = 5,
  Remove = 6,
  Check = 7,
  /// Waits until every key exists and answers all their values in one reply.
  MultiGet = 8,
  /// Sets several keys in one request.
  MultiSet = 9,
  /// Sets a key to a new value when it holds the expected one; answers what it holds.
  CompareSet = 10,
  /// Counter barrier: adds the number of arrivals it carries (1 for a rank, a host's
  /// ranks for a host store) to a counter and answers once the counter reaches a target.
  Arrive = 11,
  /// Answers, for each key, whether it exists.
  CheckEach = 12,
  /// Waits until at least one of the keys exists (or the deadline passes) and answers the
  /// values of those that exist: how a host store watches the keys its ranks wait for.
  GetAvailable = 13
};
enum class StoreStatus : uint8_t { Ok = 0, Timeout = 1, Error = 2 };

/// Appends fields to a frame; finish() fills in the length prefix.
class WireWriter {
 public:
  WireWriter() { bytes_.resize(4); }
  WireWriter& u8(uint8_t v) {
    bytes_.push_back(v);
    return *this;
  }
  WireWriter& u32(uint32_t v) { return raw(&v, 4); }
  WireWriter& u64(uint64_t v) { return raw(&v, 8); }
  WireWriter& str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    return raw(s.data(), s.size());
  }
  WireWriter& bytes(const Bytes& b) {
    u32(static_cast<uint32_t>(b.size()));
    return raw(b.data(), b.size());
  }
  Bytes finish() {
    uint32_t length = static_cast<uint32_t>(bytes_.size() - 4);
    std::memcpy(bytes_.data(), &length, 4);
    return std::move(bytes_);
  }

 private:
  WireWriter& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    bytes_.insert(bytes_.end(), b, b + n);
    return *this;
  }
  Bytes bytes_;
};

/// Reads fields from a frame body; any read past the end or a string longer than its
/// limit throws FormatError (the peer's bytes are untrusted).
class WireReader {
 public:
  WireReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t u8() {
    need(1);
    return data_[pos_++];
  }
  uint32_t u32() {
    uint32_t v;
    copy(&v, 4);
    return v;
  }
  uint64_t u64() {
    uint64_t v;
    copy(&v, 8);
    return v;
  }
  std::string str(size_t maxBytes) {
    uint32_t n = u32();
    if (n > maxBytes)
      KOLO_THROW(FormatError, "string of ", n, " bytes exceeds the limit of ", maxBytes);
    need(n);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  Bytes bytes(size_t maxBytes) {
    uint32_t n = u32();
    if (n > maxBytes)
      KOLO_THROW(FormatError, "value of ", n, " bytes exceeds the limit of ", maxBytes);
    need(n);
    Bytes b(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return b;
  }
  size_t remaining() const { return size_ - pos_; }
  /// Throws FormatError when bytes are left over (a request must be exactly its fields).
  void expectEnd() const {
    if (pos_ != size_) KOLO_THROW(FormatError, size_ - pos_, " unexpected trailing bytes");
  }

 private:
  void need(size_t n) const {
    if (size_ - pos_ < n)
      KOLO_THROW(FormatError, "truncated message: need ", n, " bytes, have ", size_ - pos_);
  }
  void copy(void* out, size_t n) {
    need(n);
    std::memcpy(out, data_ + pos_, n);
    pos_ += n;
  }
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

/// One request as the server reads it; which fields are set depends on `op`.
struct StoreRequest {
  StoreOp op = StoreOp::Hello;
  std::string token;              // Hello
  std::vector<std::string> keys;  // Set, Get, Add, Remove, CompareSet, Arrive: one; others any number
  Bytes value;                    // Set; CompareSet: the new value
  Bytes expected;                 // CompareSet
  std::vector<Bytes> values;      // MultiSet, one per key
  int64_t delta = 0;              // Add; Arrive: the count that opens the barrier
  int64_t arrivals = 1;           // Arrive: how many arrivals this request counts (at least 1)
  uint64_t timeoutMs = 0;         // Get, Wait, MultiGet, Arrive, GetAvailable
};

/// Parses one request body (the frame without its length prefix). Before the connection
/// has authenticated only Hello with the right magic and version is accepted, after it
/// only the other operations. Keys must be non-empty and at most maxKeyBytes, values at
/// most maxValueBytes. Throws FormatError on anything else: unknown opcode, truncated or
/// trailing bytes, a count or length the body cannot hold. The token is not checked here.
StoreRequest parseStoreRequest(const uint8_t* body, size_t size, bool authenticated,
                               size_t maxKeyBytes, size_t maxValueBytes);

/// One reply as the client reads it; which fields are set depends on the request's op
/// and the status.
struct StoreReply {
  StoreStatus status = StoreStatus::Ok;
  std::string message;               // Error: the server's explanation
  Bytes value;                       // Get, CompareSet, Ok
  std::vector<Bytes> values;         // MultiGet, GetAvailable (empty where absent), Ok
  int64_t counter = 0;               // Add, Arrive (this arrival's count), Ok
  bool flag = false;                 // Remove (existed), Check (all present), Ok
  std::vector<bool> present;         // CheckEach, GetAvailable, Ok
  std::vector<std::string> missing;  // Get/Wait/MultiGet/Arrive, Timeout: the keys still missing
};

/// Whether a request of kind `op` may be answered with Timeout (it waits in the server;
/// GetAvailable also waits but answers "none present" at its deadline).
bool storeOpWaits(StoreOp op);

/// Parses the reply body to a request of kind `op`. Throws FormatError when the status is
/// unknown or not possible for `op` (Timeout only answers requests that wait), or the body is
/// truncated, has trailing bytes or announces more strings than it holds.
StoreReply parseStoreReply(StoreOp op, const uint8_t* body, size_t size);

}  // namespace kolo::comm::detail
