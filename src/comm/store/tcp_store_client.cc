// The TCP store client: one connection per client object, requests serialised under a
// mutex, every socket wait bounded by a deadline (comm/socket.h). A server that closes the
// connection turns into PeerError, one that stops answering into IoError, and the
// connection is not used again.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <thread>

#include "comm/socket.h"
#include "comm/store/store_detail.h"
#include "comm/store/tcp_wire.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {

using Clock = std::chrono::steady_clock;
using detail::StoreOp;
using detail::StoreStatus;
using detail::WireWriter;

std::string HostPort::toString() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

HostPort parseHostPort(const std::string& text) {
  HostPort result;
  std::string portText;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      KOLO_THROW(InvalidArgument, "address '", text, "' is not [IPV6]:PORT");
    result.host = text.substr(1, close - 1);
    portText = text.substr(close + 2);
  } else {
    size_t colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon)
      KOLO_THROW(InvalidArgument, "address '", text,
                 "' is not HOST:PORT (write IPv6 as [ADDR]:PORT)");
    result.host = text.substr(0, colon);
    portText = text.substr(colon + 1);
  }
  unsigned port = 0;
  auto [ptr, ec] = std::from_chars(portText.data(), portText.data() + portText.size(), port);
  if (result.host.empty() || ec != std::errc() || ptr != portText.data() + portText.size() ||
      port > 65535)
    KOLO_THROW(InvalidArgument, "address '", text, "': bad host or port '", portText, "'");
  result.port = static_cast<uint16_t>(port);
  return result;
}

TcpStoreClient::TcpStoreClient(const TcpStoreClientOptions& options) : options_(options) {
  const auto deadline = detail::deadlineAfter(options_.connectTimeout);
  const Bytes hello = WireWriter()
                          .u8(static_cast<uint8_t>(StoreOp::Hello))
                          .u32(detail::kTcpStoreMagic)
                          .u8(detail::kTcpStoreVersion)
                          .str(options_.token)
                          .finish();
  // A server whose accept queue overflowed (thousands of ranks connecting at once) leaves a
  // connection that this end thinks is open unanswered, and the kernel retries it with a
  // backoff that grows to minutes. A Hello unanswered for a while is therefore retried on a
  // new connection, waiting longer each time, until the connect timeout.
  auto helloWait = std::chrono::milliseconds(1000);
  for (;;) {
    connectSocket(deadline);
    const auto helloDeadline =
        std::min({detail::deadlineAfter(options_.requestTimeout), deadline, Clock::now() + helloWait});
    Bytes reply;
    try {
      reply = roundTrip(hello, helloDeadline);
    } catch (const IoError& e) {
      ::close(fd_);
      fd_ = -1;
      broken_ = false;
      // The server closes a connection whose token it refuses; a reset or silence is the
      // overflow above.
      const bool refused = closedByServer_;
      if (refused || Clock::now() >= deadline)
        KOLO_THROW(IoError, "TCP store at ", serverAddress(), " refused this client (wrong job token?): ", e.what());
      helloWait = std::min(helloWait * 2, std::chrono::milliseconds(8000));
      continue;
    }
    bool accepted = false;
    try {
      accepted = detail::parseStoreReply(StoreOp::Hello, reply.data(), reply.size()).status == StoreStatus::Ok;
    } catch (const FormatError&) {
    }
    if (accepted) return;
    ::close(fd_);
    fd_ = -1;
    KOLO_THROW(IoError, "TCP store at ", serverAddress(),
               " refused this client (wrong job token?): it did not accept the connection");
  }
}

void TcpStoreClient::connectSocket(Clock::time_point deadline) {
  std::string lastError = "no address";
  auto pause = std::chrono::milliseconds(10);
  // The server may not be listening yet (rank 0 starts it): retry until the deadline.
  while (fd_ < 0) {
    fd_ = detail::connectTcp(options_.host, options_.port, deadline, &lastError);
    if (fd_ >= 0) break;
    if (Clock::now() >= deadline)
      KOLO_THROW(IoError, "TCP store: cannot connect to ", serverAddress(), " within ",
                 options_.connectTimeout.count(), " ms: ", lastError);
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - Clock::now()));
    pause = std::min(pause * 2, std::chrono::milliseconds(500));
  }
  detail::setNoDelayAndKeepAlive(fd_);
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::serverAddress() const {
  return HostPort{options_.host, options_.port}.toString();
}

void TcpStoreClient::interrupt() {
  // fd_ changes only in the constructor; shutting the socket down wakes a recv or poll in
  // progress without racing with close.
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

std::string TcpStoreClient::localAddress() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  return detail::addressText(reinterpret_cast<const sockaddr*>(&addr));
}

Bytes TcpStoreClient::roundTrip(const Bytes& request, Clock::time_point replyDeadline) {
  std::lock_guard lock(mutex_);
  if (broken_ || fd_ < 0)
    KOLO_THROW(IoError, "TCP store at ", serverAddress(),
               ": the connection failed earlier and is closed");
  uint32_t length = 0;
  Bytes reply;
  const detail::Transfer sent = detail::sendFully(fd_, request.data(), request.size(), replyDeadline);
  detail::Transfer received;
  if (sent.ok()) received = detail::recvFully(fd_, &length, 4, replyDeadline);
  // The server's bytes are checked like anyone's: the length before the allocation.
  const bool lengthOk = length > 0 && length <= kMaxStoreValueBytes + 64;
  if (sent.ok() && received.ok() && lengthOk) {
    reply.resize(length);
    received = detail::recvFully(fd_, reply.data(), length, replyDeadline);
  }
  if (sent.ok() && received.ok() && lengthOk) return reply;
  broken_ = true;
  std::string error;
  if (!sent.ok()) {
    error = sent.status == detail::Transfer::TimedOut ? "send timed out" : sent.reason();
  } else if (received.status == detail::Transfer::Closed) {
    closedByServer_ = true;
    error = "the server closed the connection";
  } else if (received.status == detail::Transfer::TimedOut) {
    error = "no reply before the deadline";
  } else if (!received.ok()) {
    error = received.reason();
  } else {
    error = "malformed reply of length " + std::to_string(length);
  }
  // A server that closed or reset the connection has gone with the job (rank 0 or the
  // launcher hosts it): a broken peer rather than a failure of this machine.
  if (sent.peerGone() || received.peerGone())
    KOLO_THROW(PeerError, "TCP store at ", serverAddress(), ": ", error);
  KOLO_THROW(IoError, "TCP store at ", serverAddress(), ": ", error);
}

std::chrono::steady_clock::time_point TcpStoreClient::replyDeadline(Millis timeout) const {
  // The server answers Timeout at the deadline; the extra requestTimeout covers transit,
  // past which the server counts as gone.
  Millis grace = options_.requestTimeout;
  Millis total =
      timeout > Millis::max() - grace ? Millis::max() : std::max(timeout, Millis(0)) + grace;
  return detail::deadlineAfter(total);
}

namespace {

/// Parses the reply to an `op` request; malformed replies become FormatError and Error
/// replies InvalidArgument, both naming the server.
detail::StoreReply readReply(StoreOp op, const Bytes& reply, const std::string& server) {
  detail::StoreReply parsed;
  try {
    parsed = detail::parseStoreReply(op, reply.data(), reply.size());
  } catch (const FormatError& e) {
    KOLO_THROW(FormatError, "TCP store at ", server, ": malformed reply: ", e.what());
  }
  if (parsed.status == StoreStatus::Error)
    KOLO_THROW(InvalidArgument, "TCP store at ", server, ": ", parsed.message);
  return parsed;
}

}  // namespace

void TcpStoreClient::set(const std::string& key, const Bytes& value) {
  detail::checkStoreKey(key);
  detail::checkStoreValue(key, value);
  Bytes request =
      WireWriter().u8(static_cast<uint8_t>(StoreOp::Set)).str(key).bytes(value).finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  readReply(StoreOp::Set, reply, serverAddress());
}

Bytes TcpStoreClient::get(const std::string& key, Millis timeout) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::Get))
                      .str(key)
                      .u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)))
                      .finish();
  Bytes reply = roundTrip(request, replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::Get, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP get at " + serverAddress(), {key}, timeout);
  return std::move(parsed.value);
}

void TcpStoreClient::wait(const std::vector<std::string>& keys, Millis timeout) {
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(StoreOp::Wait)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    detail::checkStoreKey(key);
    writer.str(key);
  }
  writer.u64(static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)));
  Bytes reply = roundTrip(writer.finish(), replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::Wait, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP wait at " + serverAddress(), parsed.missing, timeout);
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::Add))
                      .str(key)
                      .u64(static_cast<uint64_t>(delta))
                      .finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Add, reply, serverAddress()).counter;
}

bool TcpStoreClient::remove(const std::string& key) {
  detail::checkStoreKey(key);
  Bytes request = WireWriter().u8(static_cast<uint8_t>(StoreOp::Remove)).str(key).finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Remove, reply, serverAddress()).flag;
}

bool TcpStoreClient::check(const std::vector<std::string>& keys) {
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(StoreOp::Check)).u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    detail::checkStoreKey(key);
    writer.str(key);
  }
  Bytes reply = roundTrip(writer.finish(), detail::deadlineAfter(options_.requestTimeout));
  return readReply(StoreOp::Check, reply, serverAddress()).flag;
}

namespace {

WireWriter& keyList(WireWriter& writer, const std::vector<std::string>& keys) {
  writer.u32(static_cast<uint32_t>(keys.size()));
  for (const auto& key : keys) {
    detail::checkStoreKey(key);
    writer.str(key);
  }
  return writer;
}

uint64_t wireTimeout(Millis timeout) { return static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0)); }

}  // namespace

std::vector<Bytes> TcpStoreClient::multiGet(const std::vector<std::string>& keys, Millis timeout) {
  if (keys.empty()) return {};
  WireWriter writer;
  keyList(writer.u8(static_cast<uint8_t>(StoreOp::MultiGet)), keys).u64(wireTimeout(timeout));
  Bytes reply = roundTrip(writer.finish(), replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::MultiGet, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP multi-get at " + serverAddress(), parsed.missing, timeout);
  if (parsed.values.size() != keys.size())
    KOLO_THROW(FormatError, "TCP store at ", serverAddress(), ": ", parsed.values.size(), " values for ",
               keys.size(), " keys");
  return std::move(parsed.values);
}

void TcpStoreClient::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    KOLO_THROW(InvalidArgument, "TCP store multiSet: ", keys.size(), " keys but ", values.size(), " values");
  if (keys.empty()) return;
  WireWriter writer;
  writer.u8(static_cast<uint8_t>(StoreOp::MultiSet)).u32(static_cast<uint32_t>(keys.size()));
  for (size_t i = 0; i < keys.size(); ++i) {
    detail::checkStoreKey(keys[i]);
    detail::checkStoreValue(keys[i], values[i]);
    writer.str(keys[i]).bytes(values[i]);
  }
  Bytes reply = roundTrip(writer.finish(), detail::deadlineAfter(options_.requestTimeout));
  readReply(StoreOp::MultiSet, reply, serverAddress());
}

std::vector<bool> TcpStoreClient::checkEach(const std::vector<std::string>& keys) {
  if (keys.empty()) return {};
  WireWriter writer;
  keyList(writer.u8(static_cast<uint8_t>(StoreOp::CheckEach)), keys);
  Bytes reply = roundTrip(writer.finish(), detail::deadlineAfter(options_.requestTimeout));
  detail::StoreReply parsed = readReply(StoreOp::CheckEach, reply, serverAddress());
  if (parsed.present.size() != keys.size())
    KOLO_THROW(FormatError, "TCP store at ", serverAddress(), ": ", parsed.present.size(), " answers for ",
               keys.size(), " keys");
  return std::move(parsed.present);
}

int64_t TcpStoreClient::arrive(const std::string& key, int64_t count, Millis timeout) {
  return arriveMany(key, count, 1, timeout);
}

int64_t TcpStoreClient::arriveMany(const std::string& key, int64_t count, int64_t arrivals,
                                   Millis timeout) {
  detail::checkStoreKey(key);
  if (arrivals < 1 || arrivals > INT32_MAX)
    KOLO_THROW(InvalidArgument, "TCP barrier '", key, "': ", arrivals,
               " arrivals in one request (1 to 2^31-1)");
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::Arrive))
                      .str(key)
                      .u64(static_cast<uint64_t>(count))
                      .u64(static_cast<uint64_t>(arrivals))
                      .u64(wireTimeout(timeout))
                      .finish();
  Bytes reply = roundTrip(request, replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::Arrive, reply, serverAddress());
  if (parsed.status == StoreStatus::Timeout)
    detail::throwStoreTimeout("TCP barrier at " + serverAddress() + " (" + std::to_string(count) + " arrivals)",
                              {key}, timeout);
  return parsed.counter;
}

std::vector<std::optional<Bytes>> TcpStoreClient::getAvailable(const std::vector<std::string>& keys,
                                                               Millis timeout) {
  if (keys.empty()) return {};
  WireWriter writer;
  keyList(writer.u8(static_cast<uint8_t>(StoreOp::GetAvailable)), keys).u64(wireTimeout(timeout));
  Bytes reply = roundTrip(writer.finish(), replyDeadline(timeout));
  detail::StoreReply parsed = readReply(StoreOp::GetAvailable, reply, serverAddress());
  if (parsed.present.size() != keys.size())
    KOLO_THROW(FormatError, "TCP store at ", serverAddress(), ": ", parsed.present.size(),
               " answers for ", keys.size(), " keys");
  std::vector<std::optional<Bytes>> values(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    if (parsed.present[i]) values[i] = std::move(parsed.values[i]);
  return values;
}

Bytes TcpStoreClient::compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) {
  detail::checkStoreKey(key);
  detail::checkStoreValue(key, expected);
  detail::checkStoreValue(key, desired);
  Bytes request = WireWriter()
                      .u8(static_cast<uint8_t>(StoreOp::CompareSet))
                      .str(key)
                      .bytes(expected)
                      .bytes(desired)
                      .finish();
  Bytes reply = roundTrip(request, detail::deadlineAfter(options_.requestTimeout));
  return std::move(readReply(StoreOp::CompareSet, reply, serverAddress()).value);
}

std::shared_ptr<Store> connectTcpStore(const std::string& address, const std::string& token,
                                       std::chrono::milliseconds timeout) {
  HostPort hp = parseHostPort(address);
  TcpStoreClientOptions options;
  options.host = hp.host;
  options.port = hp.port;
  options.token = token;
  options.connectTimeout = timeout;
  options.requestTimeout = timeout;
  return std::make_shared<TcpStoreClient>(options);
}

}  // namespace kolo::comm
