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

#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

constexpr uint64_t kSegmentMagic = 0x6b6f6c6f73686d31ull;  // "kaloshm1"

struct SegmentHeader {
  uint64_t magic;
  uint64_t localCount;
  uint64_t ringBytes;
  uint64_t totalBytes;
};

size_t alignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

size_t segmentBytes(int localCount, size_t ringBytes) {
  const size_t l = static_cast<size_t>(localCount);
  size_t bytes = 64 + l * sizeof(Doorbell) + l * l * sizeof(RingControl);
  bytes = alignUp(bytes, 4096);
  return bytes + l * l * ringBytes;
}

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t value, const struct timespec* timeout) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

std::shared_ptr<HostSegment> HostSegment::create(const std::string& name, int localCount, size_t ringBytes) {
  KOLO_CHECK(localCount > 0 && (ringBytes & (ringBytes - 1)) == 0, "ring size must be a power of two");
  std::shared_ptr<HostSegment> seg(new HostSegment());
  seg->name_ = name;
  seg->localCount_ = localCount;
  seg->ringBytes_ = ringBytes;
  seg->bytes_ = segmentBytes(localCount, ringBytes);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) KOLO_THROW(IoError, "shm_open(", name, ") failed: ", std::strerror(errno));
  if (ftruncate(fd, static_cast<off_t>(seg->bytes_)) != 0) {
    int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    KOLO_THROW(IoError, "ftruncate of shared segment ", name, " to ", seg->bytes_, " bytes failed: ", std::strerror(e));
  }
  void* base = mmap(nullptr, seg->bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    KOLO_THROW(IoError, "mmap of shared segment ", name, " failed: ", std::strerror(e));
  }
  seg->base_ = base;
  auto* header = static_cast<SegmentHeader*>(base);
  header->localCount = static_cast<uint64_t>(localCount);
  header->ringBytes = ringBytes;
  header->totalBytes = seg->bytes_;
  for (int i = 0; i < localCount; ++i) new (&seg->doorbell(i)) Doorbell();
  for (int i = 0; i < localCount; ++i)
    for (int j = 0; j < localCount; ++j) new (&seg->ring(i, j)) RingControl();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  reinterpret_cast<std::atomic<uint64_t>*>(&header->magic)->store(kSegmentMagic, std::memory_order_release);
  return seg;
}

std::shared_ptr<HostSegment> HostSegment::open(const std::string& name) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) KOLO_THROW(IoError, "shm_open(", name, ") of the host segment failed: ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(SegmentHeader)) {
    close(fd);
    KOLO_THROW(FormatError, "shared segment ", name, " is too small (", st.st_size, " bytes)");
  }
  const size_t bytes = static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int e = errno;
  close(fd);
  if (base == MAP_FAILED) KOLO_THROW(IoError, "mmap of shared segment ", name, " failed: ", std::strerror(e));
  std::shared_ptr<HostSegment> seg(new HostSegment());
  seg->name_ = name;
  seg->base_ = base;
  seg->bytes_ = bytes;
  seg->unlinked_ = true;  // the creator owns the name
  auto* header = static_cast<SegmentHeader*>(base);
  const uint64_t magic =
      reinterpret_cast<std::atomic<uint64_t>*>(&header->magic)->load(std::memory_order_acquire);
  if (magic != kSegmentMagic || header->localCount == 0 || header->localCount > 4096 ||
      header->totalBytes != bytes || segmentBytes(static_cast<int>(header->localCount), header->ringBytes) != bytes) {
    KOLO_THROW(FormatError, "shared segment ", name, " has a bad header (magic ", magic, ", ",
               header->localCount, " ranks, ", bytes, " bytes)");
  }
  seg->localCount_ = static_cast<int>(header->localCount);
  seg->ringBytes_ = header->ringBytes;
  return seg;
}

HostSegment::~HostSegment() {
  if (base_ != nullptr) munmap(base_, bytes_);
  if (!unlinked_) shm_unlink(name_.c_str());
}

void HostSegment::unlink() {
  if (!unlinked_) shm_unlink(name_.c_str());
  unlinked_ = true;
}

Doorbell& HostSegment::doorbell(int local) {
  auto* p = static_cast<uint8_t*>(base_) + 64 + static_cast<size_t>(local) * sizeof(Doorbell);
  return *reinterpret_cast<Doorbell*>(p);
}

RingControl& HostSegment::ring(int fromLocal, int toLocal) {
  const size_t l = static_cast<size_t>(localCount_);
  auto* p = static_cast<uint8_t*>(base_) + 64 + l * sizeof(Doorbell) +
            (static_cast<size_t>(fromLocal) * l + static_cast<size_t>(toLocal)) * sizeof(RingControl);
  return *reinterpret_cast<RingControl*>(p);
}

uint8_t* HostSegment::ringData(int fromLocal, int toLocal) {
  const size_t l = static_cast<size_t>(localCount_);
  size_t off = alignUp(64 + l * sizeof(Doorbell) + l * l * sizeof(RingControl), 4096);
  off += (static_cast<size_t>(fromLocal) * l + static_cast<size_t>(toLocal)) * ringBytes_;
  return static_cast<uint8_t*>(base_) + off;
}

void HostSegment::prefault(int local) {
#ifdef MADV_POPULATE_WRITE
  for (int peer = 0; peer < localCount_; ++peer) {
    if (peer == local) continue;
    madvise(ringData(local, peer), ringBytes_, MADV_POPULATE_WRITE);
    madvise(ringData(peer, local), ringBytes_, MADV_POPULATE_WRITE);
  }
#else
  (void)local;
#endif
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

ShmChannel::ShmChannel(std::shared_ptr<HostSegment> segment, int selfLocal, int peerLocal, int peerPid)
    : segment_(std::move(segment)),
      out_(segment_->ring(selfLocal, peerLocal)),
      in_(segment_->ring(peerLocal, selfLocal)),
      outData_(segment_->ringData(selfLocal, peerLocal)),
      inData_(segment_->ringData(peerLocal, selfLocal)),
      peerBell_(segment_->doorbell(peerLocal)),
      capacity_(segment_->ringBytes()),
      peerPid_(peerPid) {
  outTail_ = out_.tail.load(std::memory_order_relaxed);
  outHeadSeen_ = out_.head.load(std::memory_order_acquire);
  inHead_ = in_.head.load(std::memory_order_relaxed);
  inTailSeen_ = in_.tail.load(std::memory_order_acquire);
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
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int flags = fcntl(fd_, F_GETFL, 0);
  fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
}

TcpChannel::~TcpChannel() {
  if (fd_ >= 0) close(fd_);
}

size_t TcpChannel::writeSome(const void* data, size_t bytes) {
  if (bytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection closed");
  ssize_t n = ::send(fd_, data, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  closed_ = true;
  KOLO_THROW(IoError, "connection lost while sending (", std::strerror(errno), ")");
}

size_t TcpChannel::writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (aBytes + bBytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection closed");
  struct iovec iov[2] = {{const_cast<void*>(a), aBytes}, {const_cast<void*>(b), bBytes}};
  struct msghdr msg {};
  msg.msg_iov = iov;
  msg.msg_iovlen = bBytes > 0 ? 2 : 1;
  ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n >= 0) return static_cast<size_t>(n);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  closed_ = true;
  KOLO_THROW(IoError, "connection lost while sending (", std::strerror(errno), ")");
}

size_t TcpChannel::readSome(void* data, size_t bytes) {
  if (bytes == 0) return 0;
  if (closed_) KOLO_THROW(IoError, "connection closed");
  ssize_t n = ::recv(fd_, data, bytes, MSG_DONTWAIT);
  if (n > 0) return static_cast<size_t>(n);
  if (n == 0) {
    closed_ = true;
    KOLO_THROW(IoError, "connection closed by the peer");
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  closed_ = true;
  KOLO_THROW(IoError, "connection lost while receiving (", std::strerror(errno), ")");
}

size_t Channel::writeSome2(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  size_t n = writeSome(a, aBytes);
  if (n < aBytes || bBytes == 0) return n;
  return n + writeSome(b, bBytes);
}

}  // namespace kolo::comm::native
