// The lazy TCP connections' handshake (connector.h): lookups of where peers listen,
// connecting and greeting, accepting greetings and answering them.
#include "comm/native/connector.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/socket.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

constexpr uint32_t kGreetingMagic = 0x6b6f6c68u;  // "kolh"
constexpr uint8_t kAccept = 1;
constexpr uint8_t kRefuse = 0;
/// A refused rank tries again this often until the higher rank's connection arrives.
constexpr auto kRetryAfter = std::chrono::milliseconds(100);
/// A connect that failed without a refusal (an address that does not answer) is retried this often.
constexpr auto kReconnectAfter = std::chrono::milliseconds(20);
/// How long an accepted connection may take to present its greeting.
constexpr auto kGreetingTime = std::chrono::seconds(5);

}  // namespace

Connector::Connector(ConnectorOptions options)
    : options_(std::move(options)), records_(std::move(options_.known)) {
  // Connections are accepted during progress passes, which must never wait for one.
  ::fcntl(options_.listener, F_SETFL, ::fcntl(options_.listener, F_GETFL) | O_NONBLOCK);
}

Connector::~Connector() {
  if (options_.listener >= 0) ::close(options_.listener);
  for (auto& [peer, attempt] : attempts_)
    if (attempt.fd >= 0) ::close(attempt.fd);
  for (const Incoming& in : incoming_) ::close(in.fd);
}

bool Connector::reaches(int peer) const {
  return peer >= 0 && peer < options_.size && peer != options_.rank &&
         options_.overTcp[static_cast<size_t>(peer)];
}

void Connector::want(int peer) {
  if (settled_.count(peer) != 0) return;
  attempts_.try_emplace(peer);
}

std::vector<int> Connector::connectingPeers() const {
  std::vector<int> peers;
  for (const auto& [peer, attempt] : attempts_) peers.push_back(peer);
  std::sort(peers.begin(), peers.end());
  return peers;
}

void Connector::settle(int peer, int fd, std::vector<Outcome>& out) {
  settled_.insert(peer);
  attempts_.erase(peer);
  Outcome o;
  o.peer = peer;
  o.channel = std::make_unique<TcpChannel>(fd);
  out.push_back(std::move(o));
}

void Connector::fail(int peer, std::string why, bool vanished, std::vector<Outcome>& out) {
  auto it = attempts_.find(peer);
  if (it != attempts_.end()) {
    if (it->second.fd >= 0) ::close(it->second.fd);
    attempts_.erase(it);
  }
  settled_.insert(peer);
  Outcome o;
  o.peer = peer;
  o.failure = std::move(why);
  o.vanished = vanished;
  out.push_back(std::move(o));
}

void Connector::connect(int peer, Attempt& attempt, std::vector<Outcome>& out) {
  const RankRecord& record = records_.at(peer);
  int fd = -1;
  bool refused = true;
  std::string address;
  for (const std::string& a : record.addresses) {
    std::string error;
    int code = 0;
    const auto limit = Clock::now() + options_.connectTimeout;
    fd = detail::connectTcp(a, record.port, limit, &error, options_.connectTimeout, &code);
    if (fd >= 0) {
      address = HostPort{a, static_cast<uint16_t>(record.port)}.toString();
      break;
    }
    refused = refused && code == ECONNREFUSED;
    attempt.lastError = HostPort{a, static_cast<uint16_t>(record.port)}.toString() + ": " + error;
  }
  if (fd < 0) {
    if (refused) {
      fail(peer,
           "nothing listens at its " + std::to_string(record.addresses.size()) +
               " address(es) any more (" + attempt.lastError + ")",
           true, out);
      return;
    }
    attempt.stage = Stage::Retry;
    attempt.retryAt = Clock::now() + kReconnectAfter;
    return;
  }
  Greeting greeting;
  greeting.magic = kGreetingMagic;
  greeting.fromRank = options_.rank;
  greeting.toRank = peer;
  std::memcpy(greeting.token, options_.token, kJobTokenBytes);
  const detail::Transfer greeted =
      detail::sendFully(fd, &greeting, sizeof greeting, Clock::now() + options_.connectTimeout);
  if (!greeted.ok()) {
    ::close(fd);
    fail(peer, "the connection to " + address + " failed before the greeting: " + greeted.reason(),
         greeted.peerGone(), out);
    return;
  }
  if (peer < options_.rank) {  // the higher rank's connection is always kept
    settle(peer, fd, out);
    return;
  }
  attempt.stage = Stage::Answer;
  attempt.fd = fd;
  attempt.lastError = "it has not answered the greeting sent to " + address;
}

void Connector::acceptWaiting() {
  for (;;) {
    const int fd = ::accept4(options_.listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      return;  // EAGAIN: none waiting; anything else (out of descriptors) is retried next time
    }
    incoming_.push_back(Incoming{fd, {}, 0, Clock::now() + kGreetingTime});
  }
}

void Connector::onGreeting(int fd, const Greeting& g, std::vector<Outcome>& out) {
  const int from = g.fromRank;
  const bool valid = g.magic == kGreetingMagic && g.toRank == options_.rank &&
                     std::memcmp(g.token, options_.token, kJobTokenBytes) == 0 && reaches(from);
  if (!valid) {  // a stranger or a stale job: refuse it
    ::close(fd);
    return;
  }
  const uint8_t refuse = kRefuse, accept = kAccept;
  if (from < options_.rank) {
    // The lower rank waits for our answer. A connection we made to it wins (ours to a
    // lower rank is made the moment it is greeted, so one under way has no socket yet).
    if (settled_.count(from) != 0) {
      (void)::send(fd, &refuse, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      ::close(fd);
      return;
    }
    if (::send(fd, &accept, 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1) {
      ::close(fd);  // it is gone already; a later need finds out
      return;
    }
    settle(from, fd, out);
    return;
  }
  // A higher rank's connection is kept: it may carry frames already. Ours, if under way,
  // was or will be refused.
  if (settled_.count(from) != 0) {
    ::close(fd);
    return;
  }
  const auto it = attempts_.find(from);
  if (it != attempts_.end() && it->second.fd >= 0) ::close(it->second.fd);
  if (it != attempts_.end()) it->second.fd = -1;
  settle(from, fd, out);
}

std::vector<Connector::Outcome> Connector::progress() {
  std::vector<Outcome> out;
  // Where the newly wanted peers listen: one request for all of them.
  std::vector<int> lookups;
  for (const auto& [peer, attempt] : attempts_)
    if (attempt.stage == Stage::Lookup && records_.count(peer) == 0) lookups.push_back(peer);
  if (!lookups.empty()) {
    std::sort(lookups.begin(), lookups.end());
    try {
      std::vector<RankRecord> records = options_.lookup(lookups);
      for (size_t i = 0; i < lookups.size(); ++i)
        records_.emplace(lookups[i], std::move(records[i]));
    } catch (const Error& e) {
      for (int peer : lookups) {
        Attempt& attempt = attempts_.at(peer);
        attempt.stage = Stage::Unknown;
        attempt.lastError = std::string("cannot learn where it listens: ") + e.what();
      }
    }
  }
  // Greetings first: a higher rank's connection that is here already spares connecting.
  acceptWaiting();
  const auto now = Clock::now();
  for (size_t i = 0; i < incoming_.size();) {
    Incoming& in = incoming_[i];
    auto* bytes = reinterpret_cast<uint8_t*>(&in.greeting);
    const ssize_t n = ::recv(in.fd, bytes + in.have, sizeof(Greeting) - in.have, MSG_DONTWAIT);
    if (n > 0) in.have += static_cast<size_t>(n);
    const bool failed =
        n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    if (in.have < sizeof(Greeting) && !failed && now < in.deadline) {
      ++i;
      continue;
    }
    const Incoming done = in;
    incoming_.erase(incoming_.begin() + static_cast<std::ptrdiff_t>(i));
    if (done.have == sizeof(Greeting)) {
      onGreeting(done.fd, done.greeting, out);
    } else {
      ::close(done.fd);
    }
  }
  for (int peer : connectingPeers()) {
    auto it = attempts_.find(peer);
    if (it == attempts_.end()) continue;
    Attempt& attempt = it->second;
    if (attempt.stage == Stage::Lookup && records_.count(peer) != 0) {
      connect(peer, attempt, out);
    } else if (attempt.stage == Stage::Retry && now >= attempt.retryAt) {
      connect(peer, attempt, out);
    } else if (attempt.stage == Stage::Answer) {
      uint8_t answer = 0;
      const ssize_t n = ::recv(attempt.fd, &answer, 1, MSG_DONTWAIT);
      if (n == 1 && answer == kAccept) {
        const int fd = attempt.fd;
        settle(peer, fd, out);
      } else if (n == 1) {  // refused: its own connection is on the way
        ::close(attempt.fd);
        attempt.fd = -1;
        attempt.stage = Stage::Retry;
        attempt.retryAt = now + kRetryAfter;
        attempt.lastError = "it refused this rank's connection for its own, which has not arrived";
      } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        fail(peer,
             std::string("it closed the connection before answering the greeting (") +
                 (n == 0 ? "end of stream" : std::strerror(errno)) + ")",
             true, out);
      }
    }
  }
  return out;
}

void Connector::addPollFds(std::vector<pollfd>& fds) const {
  fds.push_back({options_.listener, POLLIN, 0});
  for (const auto& [peer, attempt] : attempts_)
    if (attempt.fd >= 0) fds.push_back({attempt.fd, POLLIN, 0});
  for (const Incoming& in : incoming_) fds.push_back({in.fd, POLLIN, 0});
}

std::string Connector::describe(int peer) const {
  const auto it = attempts_.find(peer);
  if (it == attempts_.end()) return "";
  const Attempt& a = it->second;
  return "no connection to rank " + std::to_string(peer) + " yet" +
         (a.lastError.empty() ? "" : ": " + a.lastError);
}

}  // namespace kolo::comm::native
