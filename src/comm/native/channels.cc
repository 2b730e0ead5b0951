// Shared-memory rings, doorbells and TCP sockets: the byte channels under the native
// communicator's progress engine.
#include "comm/native/channels.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <new>

#include "comm/socket.h"
#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

constexpr uint64_t kSegmentMagic = 0x6b6f6c6f73686d32ull;  // "koloshm2"

struct SegmentHeader {
  uint64_t magic;
  uint64_t localCount;
  uint64_t ringBytes;
  uint64_t totalBytes;
};

constexpr size_t kHeaderBytes = 64;
static_assert(sizeof(SegmentHeader) <= kHeaderBytes);

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t value, const struct timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

size_t HostSegment::controlBytes(int localCount) {
  const size_t l = static_cast<size_t>(localCount);
  return kHeaderBytes + l * sizeof(Doorbell) + l * l * sizeof(RingControl);
}

std::shared_ptr<HostSegment> HostSegment::create(const std::string& label, int localCount, size_t ringBytes) {
  KOLO_CHECK(localCount > 0 && ringBytes >= 4096 && (ringBytes & (ringBytes - 1)) == 0,
             "ring size must be a power of two of at least 4096 bytes");
  std::shared_ptr<HostSegment> seg(new HostSegment());
  seg->label_ = label;
  seg->localCount_ = localCount;
  seg->ringBytes_ = ringBytes;
  seg->file_ = detail::ShmFile::create(label, controlBytes(localCount));
  auto* header = static_cast<SegmentHeader*>(seg->file_.data());
  header->localCount = static_cast<uint64_t>(localCount);
  header->ringBytes = ringBytes;
  header->totalBytes = controlBytes(localCount);
  for (int i = 0; i < localCount; ++i) new (&seg->doorbell(i)) Doorbell();
  for (int i = 0; i < localCount; ++i)
    for (int j = 0; j < localCount; ++j) new (&seg->ring(i, j)) RingControl();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&header->magic)->store(kSegmentMagic, std::memory_order_release);
  return seg;
}

std::shared_ptr<HostSegment> HostSegment::open(int pid, int fd) {
  std::shared_ptr<HostSegment> seg(new HostSegment());
  seg->file_ = detail::ShmFile::openPeer(pid, fd, 0);
  const size_t bytes = seg->file_.bytes();
  auto* header = static_cast<SegmentHeader*>(seg->file_.data());
  const uint64_t magic =
      bytes < kHeaderBytes ? 0 : reinterpret_cast<std::atomic<uint64_t>*>(&header->magic)->load(std::memory_order_acquire);
  if (magic != kSegmentMagic || header->localCount == 0 || header->localCount > 65536 ||
      header->totalBytes != bytes || controlBytes(static_cast<int>(header->localCount)) != bytes ||
      header->ringBytes < 4096 || (header->ringBytes & (header->ringBytes - 1)) != 0) {
    KOLO_THROW(FormatError, "host segment of process ", pid, " has a bad header (magic ", magic, ", ", bytes,
               " bytes)");
  }
  seg->localCount_ = static_cast<int>(header->localCount);
  seg->ringBytes_ = header->ringBytes;
  seg->label_ = "kolo-host-" + std::to_string(pid);
  return seg;
}

Doorbell& HostSegment::doorbell(int local) {
  auto* p = static_cast<uint8_t*>(file_.data()) + kHeaderBytes + static_cast<size_t>(local) * sizeof(Doorbell);
  return *reinterpret_cast<Doorbell*>(p);
}

RingControl& HostSegment::ring(int fromLocal, int toLocal) {
  const size_t l = static_cast<size_t>(localCount_);
  auto* p = static_cast<uint8_t*>(file_.data()) + kHeaderBytes + l * sizeof(Doorbell) +
            (static_cast<size_t>(fromLocal) * l + static_cast<size_t>(toLocal)) * sizeof(RingControl);
  return *reinterpret_cast<RingControl*>(p);
}

void ringDoorbell(Doorbell& bell) {
  // The caller has just published data (a ring's tail or head). This fence pairs with the
  // sleeper's fetch_add on `sleepers` and the seq_cst fence after it, before its re-check
  // (store-buffer pattern; Engine::sleepBriefly gives the argument): either it sees our
  // data, or we see it announced and wake it. A relaxed load suffices after the fence.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (bell.sleepers.load(std::memory_order_relaxed) != 0) {
    bell.bell.fetch_add(1, std::memory_order_seq_cst);
    futexCall(&bell.bell, FUTEX_WAKE, INT_MAX, nullptr);
  }
}

void sleepOnDoorbell(Doorbell& bell, uint32_t seen, long timeoutMicros) {
  struct timespec ts {};
  ts.tv_sec = timeoutMicros / 1000000;
  ts.tv_nsec = (timeoutMicros % 1000000) * 1000;
  futexCall(&bell.bell, FUTEX_WAIT, seen, &ts);
}

ShmChannel::ShmChannel(std::shared_ptr<HostSegment> segment, int selfLocal, int peerLocal, int peerPid,
                       std::chrono::milliseconds linger)
    : segment_(std::move(segment)),
      out_(segment_->ring(selfLocal, peerLocal)),
      in_(segment_->ring(peerLocal, selfLocal)),
      peerBell_(segment_->doorbell(peerLocal)),
      capacity_(segment_->ringBytes()),
      peerPid_(peerPid),
      linger_(linger) {
  outTail_ = out_.tail.load(std::memory_order_relaxed);
  outHeadSeen_ = out_.head.load(std::memory_order_acquire);
  inHead_ = in_.head.load(std::memory_order_relaxed);
  inTailSeen_ = in_.tail.load(std::memory_order_acquire);
}

namespace {

// Faults in this process's page tables for a ring, so the first pass of messages around
// it does not pay a fault per page (best effort; contents are not changed).
void prefault(void* data, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  madvise(data, bytes, MADV_POPULATE_WRITE);
#else
  (void)data;
  (void)bytes;
#endif
}

}  // namespace

ShmChannel::~ShmChannel() {
  // The peer stops waiting for this rank to map the ring it writes.
  in_.dataState.store(kReaderGone, std::memory_order_release);
  // Messages sent to a peer that has not mapped the ring yet live only in this process's
  // file: give the peer its deadline to take them (it maps within microseconds once it
  // makes progress on any operation), unless it is gone or has closed its communicator.
  if (outRing_.fd() < 0) return;
  const auto deadline = std::chrono::steady_clock::now() + linger_;
  for (int i = 1; out_.dataState.load(std::memory_order_acquire) == kRingPublished; ++i) {
    if (std::chrono::steady_clock::now() >= deadline || (i % 256 == 0 && !processAlive(peerPid_))) return;
    usleep(i < 64 ? 50 : 1000);
  }
}

void ShmChannel::createOutRing() {
  outRing_ = detail::ShmFile::create(segment_->label() + "-ring", capacity_);
  prefault(outRing_.data(), capacity_);
  outData_ = static_cast<uint8_t*>(outRing_.data());
  out_.dataPid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  out_.dataFd.store(outRing_.fd(), std::memory_order_relaxed);
  uint32_t unpublished = kRingUnpublished;
  if (!out_.dataState.compare_exchange_strong(unpublished, kRingPublished, std::memory_order_release))
    KOLO_THROW(PeerError, "local peer ", peerPid_, " has closed its communicator");
}

bool ShmChannel::mapInRing() {
  if (in_.dataState.load(std::memory_order_acquire) != kRingPublished) return false;
  const int pid = in_.dataPid.load(std::memory_order_relaxed);
  try {
    inRing_ = detail::ShmFile::openPeer(pid, in_.dataFd.load(std::memory_order_relaxed), capacity_);
  } catch (const IoError& e) {
    // Its file is reached through the writer's /proc entry, which goes with the writer.
    if (!processAlive(pid)) KOLO_THROW(PeerError, "local peer ", peerPid_, " exited: ", e.what());
    KOLO_THROW(IoError, "cannot map the ring written by local peer ", peerPid_, ": ", e.what());
  }
  prefault(inRing_.data(), capacity_);
  inData_ = static_cast<uint8_t*>(inRing_.data());
  in_.dataState.store(kRingMapped, std::memory_order_release);
  return true;
}

size_t ShmChannel::space() {
  size_t free = capacity_ - static_cast<size_t>(outTail_ - outHeadSeen_);
  return free;
}

void ShmChannel::copyOut(const void* data, size_t n) {
  const size_t pos = static_cast<size_t>(outTail_ & (capacity_ - 1));
  const size_t first = n < capacity_ - pos ? n : capacity_ - pos;
  std::memcpy(outData_ + pos, data, first);
  if (first < n) std::memcpy(outData_, static_cast<const uint8_t*>(data) + first, n - first);
  outTail_ += n;
}

size_t ShmChannel::writeSome(const void* data, size_t bytes) { return writeSome2(data, bytes, nullptr, 0); }

size_t ShmChannel::writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  const size_t bytes = aBytes + bBytes;
  if (bytes == 0) return 0;
  if (outData_ == nullptr) {
    createOutRing();
  } else if (outRing_.fd() >= 0 && out_.dataState.load(std::memory_order_relaxed) != kRingPublished) {
    outRing_.closeFd();  // the reader has mapped the ring, or left
  }
  size_t free = space();
  if (free < bytes) {
    outHeadSeen_ = out_.head.load(std::memory_order_acquire);
    free = space();
    if (free == 0) return 0;
  }
  const size_t na = aBytes < free ? aBytes : free;
  copyOut(a, na);
  const size_t nb = bBytes < free - na ? bBytes : free - na;
  if (nb > 0) copyOut(b, nb);
  out_.tail.store(outTail_, std::memory_order_release);
  ringDoorbell(peerBell_);
  return na + nb;
}

size_t ShmChannel::readSome(void* data, size_t bytes) {
  if (bytes == 0) return 0;
  if (inData_ == nullptr && !mapInRing()) return 0;
  size_t avail = static_cast<size_t>(inTailSeen_ - inHead_);
  if (avail < bytes) {
    inTailSeen_ = in_.tail.load(std::memory_order_acquire);
    avail = static_cast<size_t>(inTailSeen_ - inHead_);
    if (avail == 0) return 0;
  }
  const size_t n = bytes < avail ? bytes : avail;
  const size_t pos = static_cast<size_t>(inHead_ & (capacity_ - 1));
  const size_t first = n < capacity_ - pos ? n : capacity_ - pos;
  std::memcpy(data, inData_ + pos, first);
  if (first < n) std::memcpy(static_cast<uint8_t*>(data) + first, inData_, n - first);
  inHead_ += n;
  in_.head.store(inHead_, std::memory_order_release);
  consumed_ = true;
  return n;
}

void ShmChannel::readsDone() {
  if (!consumed_) return;
  consumed_ = false;
  ringDoorbell(peerBell_);  // the peer may be waiting for ring space
}

bool ShmChannel::peerAlive() { return processAlive(peerPid_); }

bool processAlive(int pid) {
  if (pid <= 0) return true;
  if (pid == static_cast<int>(getpid())) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return false;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  if (paren == std::string::npos || paren + 2 >= line.size()) return false;
  const char state = line[paren + 2];
  return state != 'Z' && state != 'X' && state != 'x';
}

TcpChannel::TcpChannel(int fd) : fd_(fd) {
  detail::setNoDelay(fd_);
  int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  peer_ = detail::peerAddress(fd_);
}

TcpChannel::~TcpChannel() {
  if (fd_ >= 0) close(fd_);
}

void TcpChannel::fail(const char* doing, int error) {
  closed_ = true;
  if (error == 0) KOLO_THROW(PeerError, "connection to ", peer_, " closed by the peer");
  if (error == ECONNRESET || error == EPIPE || error == ECONNABORTED)
    KOLO_THROW(PeerError, "connection to ", peer_, " lost while ", doing, " (", std::strerror(error), ")");
  KOLO_THROW(IoError, "connection to ", peer_, " failed while ", doing, " (", std::strerror(error), ")");
}

size_t TcpChannel::writeSome(const void* data, size_t bytes) {
  if (bytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection to ", peer_, " closed");
  ssize_t n = ::send(fd_, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("sending", errno);
}

size_t TcpChannel::writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (aBytes + bBytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection to ", peer_, " closed");
  struct iovec iov[2] = {{const_cast<void*>(a), aBytes}, {const_cast<void*>(b), bBytes}};
  struct msghdr msg {};
  msg.msg_iov = iov;
  msg.msg_iovlen = bBytes > 0 ? 2 : 1;
  ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("sending", errno);
}

size_t TcpChannel::readSome(void* data, size_t bytes) {
  if (bytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection to ", peer_, " closed");
  ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) fail("receiving", 0);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("receiving", errno);
}

size_t Channel::writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  size_t n = writeSome(a, aBytes);
  if (n < aBytes || bBytes == 0) return n;
  return n + writeSome(b, bBytes);
}

}  // namespace kolo::comm::native
