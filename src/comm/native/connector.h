// Lazy TCP connections between the ranks of a job: the connection to a peer is opened when
// an operation first needs it, so a rank holds sockets to the peers its algorithms pair it
// with, not to every rank. Where a peer listens is looked up in the store then, for the
// peers wanted together in one request.
//
// Protocol. Either rank of a pair may start the connection (both do when each needs the
// other at once). The starter connects to the peer's listener and writes a greeting: magic,
// its rank, the peer's rank, the job token. When both start, the connection started by the
// higher rank is the one kept:
//   - the higher rank writes frames right after its greeting; the lower rank accepts every
//     valid greeting from a higher rank and drops a connection of its own that is under way;
//   - the lower rank waits for a one-byte answer before it writes anything: the higher rank
//     answers kAccept unless it has a connection to the lower rank already or is starting
//     one, when it answers kRefuse; a refused rank accepts the higher rank's connection,
//     which is on its way, and tries again every kRetryAfter until it arrives (a retry is
//     refused too while the first is in the kernel's queue; a retry that finds nobody
//     listening shows that the peer left).
// A rank decides each greeting under its engine's lock, so it never both accepts the lower
// rank's connection and starts its own. Nothing listens at a rank's port once its process or
// communicator is gone: a connection refused at every address means the peer left.
#pragma once

#include <poll.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "comm/native/channels.h"
#include "comm/native/control_plane.h"
#include "comm/native/rank_record.h"

namespace kolo::comm::native {

/// The records of `ranks` (one request for all of them); throws kolo::Error when they
/// cannot be read.
using RecordLookup = std::function<std::vector<RankRecord>(const std::vector<int>& ranks)>;

struct ConnectorOptions {
  int rank = 0;
  int size = 0;
  uint8_t token[kJobTokenBytes] = {};
  /// The listening socket peers connect to; the connector owns it from then on.
  int listener = -1;
  /// Per rank: whether it is reached over TCP (on another host, or without shared memory).
  std::vector<bool> overTcp;
  /// Records known already (read at rendezvous): no lookup for these ranks.
  std::unordered_map<int, RankRecord> known;
  /// Looks up the others. When it fails (the store may be gone: a store that rank 0 hosts
  /// lives only as long as rank 0's communicator), this rank waits for the peer to connect
  /// instead, which it does if it needs this rank too and knows where it listens.
  RecordLookup lookup;
  /// Bound on one attempt to connect to one of a peer's addresses.
  std::chrono::milliseconds connectTimeout{3000};
};

/// One rank's side of the protocol above. Not thread-safe: the engine calls it under its
/// lock. Nothing blocks on a peer's process, except a connect to an address that does not
/// answer (bounded by connectTimeout).
class Connector {
 public:
  explicit Connector(ConnectorOptions options);
  /// Closes the listener and the connections not handed out.
  ~Connector();
  Connector(const Connector&) = delete;
  Connector& operator=(const Connector&) = delete;

  /// Whether `peer` is reached through this connector.
  bool reaches(int peer) const;
  /// Starts connecting to `peer` unless a connection to it was handed out, failed or is
  /// under way. The work happens in progress().
  void want(int peer);
  /// Whether a connection to `peer` is under way (wanted, not handed out, not failed).
  bool connecting(int peer) const { return attempts_.count(peer) != 0; }
  /// The peers with a connection under way.
  std::vector<int> connectingPeers() const;
  /// Whether progress() has work besides watching the listener.
  bool busy() const { return !attempts_.empty() || !incoming_.empty(); }

  /// A connection settled: a channel to `peer`, or why there will be none.
  struct Outcome {
    int peer = -1;
    std::unique_ptr<Channel> channel;  // null when it failed
    std::string failure;
    /// The failure shows that the peer left (PeerError), rather than that this end failed.
    bool vanished = false;
  };
  /// Looks up the peers wanted since the last call, connects, accepts and reads greetings
  /// and answers that have arrived, retries refused connections that are due. Returns the
  /// connections settled.
  std::vector<Outcome> progress();
  /// Adds the descriptors a sleeping rank watches for the handshakes (POLLIN): the
  /// listener first, then the connections under way.
  void addPollFds(std::vector<pollfd>& fds) const;
  /// Why the connection to `peer` is not made yet ("" when none is under way), for the
  /// message of an operation that ran out of time waiting for it.
  std::string describe(int peer) const;

 private:
  using Clock = std::chrono::steady_clock;
  /// Lookup: where the peer listens is to be looked up; Answer: greeted, waiting for the
  /// peer's answer; Retry: to connect again at retryAt; Unknown: the lookup failed, the
  /// peer's own connection is all this rank can take.
  enum class Stage { Lookup, Answer, Retry, Unknown };
  struct Attempt {
    Stage stage = Stage::Lookup;
    int fd = -1;  // Answer: the connection that waits for the peer's answer
    Clock::time_point retryAt{};
    std::string lastError;
  };
  struct Greeting {
    uint32_t magic = 0;
    int32_t fromRank = -1;
    int32_t toRank = -1;
    uint8_t token[kJobTokenBytes] = {};
  };
  /// An accepted connection whose greeting is still arriving.
  struct Incoming {
    int fd = -1;
    Greeting greeting;
    size_t have = 0;
    Clock::time_point deadline{};
  };

  /// Connects to `peer` and greets it; settles it or waits for its answer.
  void connect(int peer, Attempt& attempt, std::vector<Outcome>& out);
  void acceptWaiting();
  /// A whole greeting arrived on `fd`: takes the connection or closes it.
  void onGreeting(int fd, const Greeting& greeting, std::vector<Outcome>& out);
  void settle(int peer, int fd, std::vector<Outcome>& out);
  void fail(int peer, std::string why, bool vanished, std::vector<Outcome>& out);

  ConnectorOptions options_;
  std::unordered_map<int, Attempt> attempts_;
  std::unordered_map<int, RankRecord> records_;
  /// Peers whose connection was handed out or failed: never connected to again.
  std::unordered_set<int> settled_;
  std::vector<Incoming> incoming_;
};

}  // namespace kolo::comm::native
