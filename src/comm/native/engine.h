// The native transports' progress engine: per-peer queues of framed sends and posted
// receives over byte channels, matching of arriving frames (collective stamp checks, p2p
// tags, buffering of early arrivals), and waits that spin, then sleep, with deadlines and
// peer liveness checks. One engine per process-level communicator; sub-groups share it.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/native/channels.h"
#include "comm/native/connector.h"
#include "comm/native/frame.h"

namespace kolo::comm::native {

using Clock = std::chrono::steady_clock;

/// Who is waiting for what, for error messages: "allreduce #3 on rank 0".
struct OpLabel {
  const char* name = "operation";
  uint64_t seq = 0;
  bool collective = true;
  int groupRank = 0;
  int groupPeer = 0;
  int tag = 0;
  std::string prefix() const;
};

struct Op {
  virtual ~Op() = default;
  int peer = 0;  // engine (world) rank
  OpLabel label;
  bool complete = false;
  std::exception_ptr error;
};

struct SendOp : Op {
  FrameHeader header;
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  size_t sent = 0;  // header and payload bytes written so far
};

struct RecvOp : Op {
  /// A receive from any of these engine ranks (postRecvAny; `peer` is -1 until a frame from
  /// one of them matches it); empty for a receive from `peer`.
  std::vector<int> from;
  /// The group ranks of `from`, in the same order (for messages and Work::source()).
  std::vector<int> fromGroupRanks;
  FrameKind kind = FrameKind::Collective;
  uint32_t context = 0;
  int32_t tag = 0;
  uint64_t seq = 0;
  Signature expected;
  uint8_t* data = nullptr;
  size_t bytes = 0;
};

class Engine {
 public:
  Engine(int rank, int size);
  ~Engine();

  int rank() const { return rank_; }
  int size() const { return size_; }

  /// Installs the channel to `peer` (during rendezvous, before any traffic).
  void setChannel(int peer, std::unique_ptr<Channel> channel);
  /// Opens the channels to the peers it reaches when an operation first needs them (a
  /// send, a receive, a receive from any of several), instead of at rendezvous. An
  /// operation on such a peer queues until its connection is made; a peer found gone
  /// while connecting fails it with PeerError.
  void setConnector(std::unique_ptr<Connector> connector);
  /// This rank's doorbell in the host segment (null without shared memory).
  void setDoorbell(Doorbell* bell) { bell_ = bell; }
  bool hasChannel(int peer) const;
  /// How long a wait busy-polls before yielding: long when every local rank has a core
  /// (small messages then never syscall), short on an oversubscribed host.
  void setSpinTime(std::chrono::microseconds spin) { spinTime_ = spin; }
  const char* channelKind(int peer) const;

  /// Queues a frame; `data` must stay valid until the op completes or is cancelled.
  std::shared_ptr<SendOp> postSend(int peer, const FrameHeader& header, const void* data, size_t bytes,
                                   const OpLabel& label);
  /// Posts a receive of exactly `bytes` into `data`.
  std::shared_ptr<RecvOp> postRecv(int peer, FrameKind kind, uint32_t context, int32_t tag, uint64_t seq,
                                   const Signature& expected, void* data, size_t bytes, const OpLabel& label);

  /// Posts a point-to-point receive of exactly `bytes` into `data` from whichever of `from`
  /// (engine ranks; `fromGroupRanks` their group ranks) sends a frame with this context and
  /// tag first; an early arrival is taken at once. Frames from one peer still match in the
  /// order sent, and a receive posted for that peer by name is matched before this one.
  /// Fails with PeerError once every rank of `from` has left.
  std::shared_ptr<RecvOp> postRecvAny(std::vector<int> from, std::vector<int> fromGroupRanks, uint32_t context,
                                      int32_t tag, const Signature& expected, void* data, size_t bytes,
                                      const OpLabel& label);

  /// Blocks until `op` completes or `deadline` passes; rethrows its error. On expiry
  /// throws Timeout ("... no data from rank P after T s"); a vanished peer -> PeerError.
  void wait(Op& op, Clock::time_point deadline, std::chrono::milliseconds budget);
  /// How this engine's waits ended so far: each wait() counts once, under the slowest way
  /// it went (a wait that slept also spun); the yields made; the shared-memory rings set
  /// up. For benchmarks and tests; takes the engine's lock.
  struct WaitCounts {
    uint64_t spun = 0;     // complete at once or while busy-polling
    uint64_t yielded = 0;  // complete after giving the CPU away with sched_yield
    uint64_t slept = 0;    // complete after sleeping (doorbell futex or poll) at least once
    uint64_t yieldCalls = 0;  // sched_yield calls made by all waits
    uint64_t ringSetups = 0;  // shared-memory rings made or mapped so far (Channel::setups)
    uint64_t tcpChannels = 0;  // TCP connections made so far (to the peers operations needed)
  };
  WaitCounts waitCounts();
  /// Makes progress once without blocking; returns whether `op` is complete.
  bool test(Op& op);
  /// Withdraws an op that will not be waited for (its buffer may go away). An op cut off
  /// mid-message leaves the channel unusable, which later operations report.
  void cancel(const std::shared_ptr<Op>& op);
  /// This rank gives up on the job's collectives because of `cause` (a peer it lost, a
  /// deadline it ran out of, a peer's memory it could not reach, a peer that called another
  /// collective or size): tells every other live peer once, with an Abort frame naming the
  /// first loss this engine saw (else `cause`), so that a rank waiting on this one fails at
  /// once instead of at its deadline: with Timeout for GaveUp::TimedOut, Mismatch for
  /// GaveUp::Disagreed, else PeerError. Blocks for at most a fraction of a second while the
  /// frames are written; a second call does nothing.
  ///
  /// "Every peer" is every peer with a channel or a connection under way, in either
  /// direction (connections waiting at the listener are taken first, so a rank that is
  /// connecting to this one because it waits on it is told too). A rank that never needed
  /// this one has no channel and is not waiting on it: it learns of the loss from the ranks
  /// it does wait on, whose failed collectives send their own Aborts.
  void abort(const std::string& cause, GaveUp why);

 private:
  struct Unexpected {
    FrameHeader header;
    std::vector<uint8_t> payload;
    size_t received = 0;
    bool complete = false;
  };
  struct Peer {
    std::unique_ptr<Channel> channel;
    std::deque<std::shared_ptr<SendOp>> sends;
    std::deque<std::shared_ptr<RecvOp>> recvs;
    std::deque<std::shared_ptr<Unexpected>> unexpected;
    FrameHeader inHeader;
    size_t headerHave = 0;
    bool inBody = false;
    uint64_t bodyLeft = 0;
    std::shared_ptr<RecvOp> inRecv;
    std::shared_ptr<Unexpected> inUnexpected;
    std::string broken;     // why the channel is unusable ("" while healthy)
    bool vanished = false;  // broken because the peer left, not for what it sent
    GaveUp why = GaveUp::PeerLost;  // ... and why it left (its Abort said so)
  };

  /// Whether a transfer to or from this peer is queued, posted or under way.
  static bool busy(const Peer& p);
  /// Before an operation is queued for `peer`: starts connecting when it has no channel
  /// yet and the connector reaches it; InvalidArgument when nothing does. Under mutex_.
  void needChannel(int peer, const OpLabel& label);
  /// Runs the connector's handshakes: installs the channels it settles, breaks the peers
  /// it found gone. Under mutex_.
  void pumpConnector();
  void installChannel(int peer, std::unique_ptr<Channel> channel);
  void progressAll();
  void progressPeer(int peer);
  void readFrames(int peer);
  /// A transfer with `peer` failed (`what`): reads the frames it wrote before it left (its
  /// Abort breaks it with its reason), else breaks it as gone.
  void lostPeer(int peer, const std::string& what, bool vanished);
  void onHeader(int peer);
  void finishBody(int peer);
  void matchUnexpected(int peer);
  /// Checks a frame against the receive it matched; returns the error or null.
  std::exception_ptr checkFrame(const RecvOp& op, const FrameHeader& h) const;
  /// Fails everything queued for `peer` and every later operation with it: PeerError when
  /// the peer `vanished` (closed, reset or exited; Timeout when it gave up on a deadline,
  /// Mismatch when it found ranks disagreeing: `gaveUp`), IoError otherwise.
  void breakPeer(int peer, const std::string& why, bool vanished = false, GaveUp gaveUp = GaveUp::PeerLost);
  /// The error an operation on a broken peer fails with.
  static std::exception_ptr brokenError(const Peer& p, const OpLabel& label);
  void failOp(Op& op, std::exception_ptr error);
  /// `op`, a collective, failed because its peer left (or gave up): tells every other peer
  /// once, with an Abort frame carrying rootCause_, so that a rank waiting on a live rank
  /// that waits on the lost one fails now, naming the lost one, instead of at its deadline.
  /// Under mutex_.
  void tellPeers(const Op& op);
  /// Sends rootCause_ in an Abort frame to every live peer with a usable channel, once;
  /// writes for up to kAbortFlush. Under mutex_.
  void sendAborts();
  /// The oldest receive from any source that `peer`'s frame `h` matches, taken out of
  /// anyRecvs_ and bound to `peer`; null when none.
  std::shared_ptr<RecvOp> claimAnyRecv(int peer, const FrameHeader& h);
  /// Fails the receives from any source whose every rank has left.
  void failOrphanedAnyRecvs();
  /// Breaks the channel to `peer` (group rank `groupPeer` in messages) when its process is
  /// gone, after reading what it wrote before leaving.
  void checkAlive(int peer, int groupPeer);
  /// An Abort frame from `peer` has arrived whole in `u`: the peer is gone for this job.
  void onAbort(int peer, const Unexpected& u);
  [[noreturn]] void throwTimeout(const Op& op, std::chrono::milliseconds budget);
  /// "; meanwhile rank Q (shm peer) has exited ..." naming every peer that left the job
  /// (closed its channel or whose process is gone); "" when none did. Takes mutex_.
  std::string exitedPeers();
  void sleepBriefly(long micros);

  int rank_;
  int size_;
  std::vector<Peer> peers_;
  Doorbell* bell_ = nullptr;
  std::chrono::microseconds spinTime_{250};
  std::vector<int> tcpPeers_;
  /// Peers with a channel, in the order they got it: what progress passes look at.
  std::vector<int> channelled_;
  std::unique_ptr<Connector> connector_;
  /// Progress passes since the connector last looked at its listener while idle.
  unsigned idlePasses_ = 0;
  /// Receives from any source not matched yet, oldest first.
  std::deque<std::shared_ptr<RecvOp>> anyRecvs_;
  /// The first loss this engine saw ("rank 1 (shm peer) has exited"), or the one a peer's
  /// Abort named; what tellPeers() sends (kept alive while it is sent).
  std::string rootCause_;
  GaveUp rootWhy_ = GaveUp::PeerLost;  // what kind of cause rootCause_ is
  bool told_ = false;
  /// Bytes written to or read from any channel so far (under mutex_): a sleeper's re-check
  /// compares it to see whether its progress pass did anything.
  uint64_t bytesMoved_ = 0;
  std::atomic<uint64_t> spun_{0}, yielded_{0}, slept_{0}, yieldCalls_{0};  // waitCounts()
  std::mutex mutex_;
};

}  // namespace kolo::comm::native
