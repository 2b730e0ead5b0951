// Byte channels between two ranks: a pair of lock-free single-producer/single-consumer
// shared-memory rings controlled from a host-wide segment, or a TCP socket. Both are non-blocking; the
// progress engine (engine.h) frames messages on top and decides when to sleep.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/shm_file.h"

namespace kolo::comm::native {

/// One direction of a byte stream to or from a peer. writeSome/readSome never block and
/// return the number of bytes moved (possibly 0); they throw PeerError when the peer is gone
/// (closed, reset, exited) and IoError when this end fails.
class Channel {
 public:
  virtual ~Channel() = default;
  virtual size_t writeSome(const void* data, size_t bytes) = 0;
  /// Writes a prefix of a followed by b as one publication (header + small payload in a
  /// single ring update or one sendmsg); returns the bytes moved from a and b together.
  virtual size_t writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes);
  virtual size_t readSome(void* data, size_t bytes) = 0;
  /// Called after a burst of readSome calls: tells a writer that may wait for space (one
  /// wake-up per burst instead of one per read).
  virtual void readsDone() {}
  /// Socket to poll() when sleeping, or -1 for shared memory (which uses the doorbell).
  virtual int pollFd() const { return -1; }
  /// Slow liveness check (a /proc lookup for shared memory); false when the peer is gone.
  virtual bool peerAlive() = 0;
  /// "shm" or "tcp".
  virtual const char* kind() const = 0;
  /// CPU the peer last waited on, or -1 when unknown.
  virtual int peerCpu() const { return -1; }
  /// Rings this channel has made or mapped so far (shared memory sets them up on first use;
  /// a socket is connected at rendezvous: 0). For tests: a call that sets one up is slow.
  virtual int setups() const { return 0; }
};

// ---- shared memory ----

/// Per-rank wake-up word in the host segment. A sleeper bumps `sleepers`, issues a seq_cst
/// fence, reads `bell`, re-checks its condition and futex-waits on the `bell` value it
/// read; whoever makes progress for it publishes, issues a seq_cst fence, and bumps `bell`
/// and wakes it only when `sleepers` is non-zero, so the fast path never makes a syscall.
/// Both fences are needed (store-buffer pattern; see Engine::sleepBriefly).
struct alignas(64) Doorbell {
  std::atomic<uint32_t> bell{0};
  std::atomic<uint32_t> sleepers{0};
  std::atomic<int32_t> pid{0};
  /// CPU the rank last waited on (-1: unknown); a peer waiting on the same CPU yields at
  /// once instead of spinning, since the rank it waits for cannot run meanwhile.
  std::atomic<int32_t> cpu{-1};
};

/// RingControl::dataState: where the ring's data stands.
constexpr uint32_t kRingUnpublished = 0;  // no message yet
constexpr uint32_t kRingPublished = 1;    // the writer made it; dataPid/dataFd say where
constexpr uint32_t kRingMapped = 2;       // the reader has mapped it
constexpr uint32_t kReaderGone = 3;       // the reader closed its communicator

/// One direction between two local ranks. The ring's data is not in the host segment: its
/// writer creates it on the first message (an unnamed shared file, see comm/shm_file.h) and
/// publishes where it is (dataPid, dataFd, then kRingPublished) before the first tail; the
/// reader maps it when it first looks for data and sets kRingMapped, after which the writer
/// closes its descriptor. So memory grows with the peers the algorithms pair, not with the
/// square of the rank count.
struct alignas(64) RingControl {
  std::atomic<uint64_t> tail{0};  // bytes ever written (producer)
  std::atomic<uint32_t> dataState{0};
  std::atomic<int32_t> dataPid{0};
  std::atomic<int32_t> dataFd{-1};
  char pad0[44];
  std::atomic<uint64_t> head{0};  // bytes ever read (consumer)
  char pad1[56];
};
static_assert(sizeof(RingControl) == 128);

/// The control block shared by the ranks of one host: a header, one doorbell per rank and
/// one RingControl per ordered pair of local ranks (128 bytes each; ring data lives apart).
/// It is an unnamed file: the lowest local rank creates it, the others open it through
/// /proc/<pid>/fd of the creator, who then closes its descriptor; there is never a name.
class HostSegment {
 public:
  /// Creates the block for `localCount` ranks whose rings hold `ringBytes` (a power of two).
  /// `label` names the job in error messages and /proc/<pid>/maps. Throws IoError.
  static std::shared_ptr<HostSegment> create(const std::string& label, int localCount, size_t ringBytes);
  /// Maps the block that process `pid` holds as descriptor `fd`. Throws IoError / FormatError.
  static std::shared_ptr<HostSegment> open(int pid, int fd);
  /// Bytes of the block for `localCount` ranks.
  static size_t controlBytes(int localCount);

  /// The creator's descriptor (-1 in other ranks and once closed).
  int fd() const { return file_.fd(); }
  /// Closes the creator's descriptor once every local rank has mapped the block.
  void closeFd() { file_.closeFd(); }
  int localCount() const { return localCount_; }
  size_t ringBytes() const { return ringBytes_; }
  const std::string& label() const { return label_; }
  Doorbell& doorbell(int local);
  RingControl& ring(int fromLocal, int toLocal);

 private:
  HostSegment() = default;

  detail::ShmFile file_;
  std::string label_;
  int localCount_ = 0;
  size_t ringBytes_ = 0;
};

/// Bumps the doorbell of a rank that may be asleep (no syscall when nobody sleeps).
void ringDoorbell(Doorbell& bell);
/// Sleeps on `bell` until it differs from `seen` or `timeoutMicros` pass.
void sleepOnDoorbell(Doorbell& bell, uint32_t seen, long timeoutMicros);

/// Full-duplex shared-memory channel between local ranks `self` and `peer`.
class ShmChannel : public Channel {
 public:
  /// `linger`: how long the destructor waits, while the peer lives and keeps its
  /// communicator, for it to map a ring that holds messages it has not read yet (the ring
  /// goes when its writer does).
  ShmChannel(std::shared_ptr<HostSegment> segment, int selfLocal, int peerLocal, int peerPid,
             std::chrono::milliseconds linger);
  ~ShmChannel() override;
  size_t writeSome(const void* data, size_t bytes) override;
  size_t writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) override;
  size_t readSome(void* data, size_t bytes) override;
  void readsDone() override;
  bool peerAlive() override;
  const char* kind() const override { return "shm"; }
  int peerCpu() const override { return peerBell_.cpu.load(std::memory_order_relaxed); }
  int setups() const override { return (outData_ != nullptr ? 1 : 0) + (inData_ != nullptr ? 1 : 0); }

 private:
  size_t space();
  void copyOut(const void* data, size_t n);
  /// Creates the ring this rank writes (first message) and publishes where it is.
  void createOutRing();
  /// Maps the ring the peer writes once it has published it; false until then.
  bool mapInRing();

  std::shared_ptr<HostSegment> segment_;
  RingControl& out_;
  RingControl& in_;
  detail::ShmFile outRing_;
  detail::ShmFile inRing_;
  uint8_t* outData_ = nullptr;
  uint8_t* inData_ = nullptr;
  Doorbell& peerBell_;
  size_t capacity_;
  uint64_t outTail_ = 0;       // our copy of out_.tail
  uint64_t outHeadSeen_ = 0;   // last head of out_ we read
  uint64_t inHead_ = 0;        // our copy of in_.head
  uint64_t inTailSeen_ = 0;    // last tail of in_ we read
  bool consumed_ = false;      // readSome freed ring space since the last readsDone
  int peerPid_;
  std::chrono::milliseconds linger_;
};

/// Whether process `pid` exists and has not exited (a zombie counts as gone).
bool processAlive(int pid);

// ---- TCP ----

/// A connected, non-blocking TCP socket with TCP_NODELAY. Owns the descriptor.
class TcpChannel : public Channel {
 public:
  explicit TcpChannel(int fd);
  ~TcpChannel() override;
  size_t writeSome(const void* data, size_t bytes) override;
  size_t writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) override;
  size_t readSome(void* data, size_t bytes) override;
  int pollFd() const override { return fd_; }
  bool peerAlive() override { return !closed_; }
  const char* kind() const override { return "tcp"; }

 private:
  /// Marks the connection unusable and throws: PeerError when the peer closed or reset
  /// it, IoError for any other failure of this end.
  [[noreturn]] void fail(const char* doing, int error);

  int fd_;
  bool closed_ = false;
  std::string peer_;  // the peer's "host:port", for messages
};

}  // namespace kolo::comm::native
