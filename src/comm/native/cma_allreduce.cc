// Single-copy shared-host all-reduce over cross-memory attach.
#include "comm/native/cma_allreduce.h"

#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include "comm/algorithms/barrier.h"
#include "comm/algorithms/reduce_kernels.h"
#include "comm/native/channels.h"
#include "kolo/error.h"

namespace kolo::comm::native {

namespace {

// Piece of a peer's slice pulled into this rank's cache before it is reduced.
constexpr size_t kPieceBytes = 256 * 1024;
// Slice boundaries fall on cache lines so no two ranks write the same line.
constexpr size_t kSliceAlignBytes = 64;

struct BufferAddresses {
  uint64_t send;
  uint64_t recv;
};

// Everyone's buffer addresses in log2(n) rounds (Bruck): after the round at distance d this
// rank holds the records of ranks me .. me + 2d - 1. Each rank talks to log2(n) peers only,
// so no shared-memory ring is made for every pair of a large host.
std::vector<BufferAddresses> allgatherAddresses(GroupLinks& links, const BufferAddresses& mine) {
  const int n = links.size();
  const int me = links.rank();
  std::vector<BufferAddresses> held(static_cast<size_t>(n));
  held[0] = mine;
  for (int d = 1; d < n; d *= 2) {
    const size_t records = static_cast<size_t>(std::min(d, n - d));
    auto recv = links.irecv((me + d) % n, &held[static_cast<size_t>(d)], records * sizeof(BufferAddresses));
    links.send((me - d + n) % n, held.data(), records * sizeof(BufferAddresses));
    recv->wait();
  }
  std::vector<BufferAddresses> byRank(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) byRank[static_cast<size_t>((me + i) % n)] = held[static_cast<size_t>(i)];
  return byRank;
}

}  // namespace

namespace {

// Copies `bytes` between this process and process `pid` (Linux CMA), retrying short
// transfers and EINTR; a copy within this process is a memcpy. False with errno on failure.
bool copyPeerMemory(int pid, bool toPeer, void* remote, void* local, size_t bytes) {
  if (pid == static_cast<int>(getpid())) {
    if (toPeer)
      std::memcpy(remote, local, bytes);
    else
      std::memcpy(local, remote, bytes);
    return true;
  }
  size_t done = 0;
  while (done < bytes) {
    struct iovec l {static_cast<char*>(local) + done, bytes - done};
    struct iovec r {static_cast<char*>(remote) + done, bytes - done};
    const ssize_t n = toPeer ? process_vm_writev(pid, &l, 1, &r, 1, 0) : process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) {
      errno = EFAULT;
      return false;
    }
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

bool readPeerMemory(int pid, void* local, const void* remote, size_t bytes) {
  return copyPeerMemory(pid, false, const_cast<void*>(remote), local, bytes);
}

bool writePeerMemory(int pid, void* remote, const void* local, size_t bytes) {
  return copyPeerMemory(pid, true, remote, const_cast<void*>(local), bytes);
}

void cmaAllreduce(GroupLinks& links, const std::vector<int>& pids, const void* sendbuf, void* recvbuf, size_t count,
                  DType dtype, ReduceOp op) {
  const int n = links.size();
  const int me = links.rank();
  const size_t esize = dtypeSize(dtype);

  // 1. Everyone learns where everyone's buffers are (and checks the signature).
  const std::vector<BufferAddresses> addrs =
      allgatherAddresses(links, {reinterpret_cast<uint64_t>(sendbuf), reinterpret_cast<uint64_t>(recvbuf)});

  // Slice r = [lo(r), lo(r+1)) elements, on cache-line boundaries.
  const size_t unit = std::max<size_t>(1, kSliceAlignBytes / esize);
  const size_t units = (count + unit - 1) / unit;
  auto lo = [&](int r) {
    const size_t u = units / n * r + std::min<size_t>(static_cast<size_t>(r), units % n);
    return std::min(count, u * unit);
  };
  auto failAccess = [&](int p, const char* how) {
    const int error = errno;
    // ESRCH: the process is gone; a peer that exited leaves no memory to read.
    if (error == ESRCH || !processAlive(pids[p]))
      KOLO_THROW(PeerError, collectiveName(links.signature().collective), " #", links.seq(), " on rank ", me,
                 ": cannot ", how, " the buffer of rank ", p, " (pid ", pids[p], "), which has exited");
    KOLO_THROW(IoError, collectiveName(links.signature().collective), " #", links.seq(), " on rank ", me,
               ": cannot ", how, " the buffer of rank ", p, " (pid ", pids[p], "): ", std::strerror(error));
  };

  // 2. Reduce my slice one cache-sized piece at a time: own data op each peer's piece,
  //    then push the finished piece into every peer's recvbuf while it is still in cache.
  //    Only this rank touches this slice of anyone's buffers (others read and write their
  //    own slices), so this is safe in place too.
  const size_t myLo = lo(me);
  const size_t myHi = lo(me + 1);
  const size_t pieceElems = std::max<size_t>(unit, kPieceBytes / esize / unit * unit);
  std::unique_ptr<char[]> piece(new char[pieceElems * esize]);
  auto* out = static_cast<char*>(recvbuf);
  const auto* own = static_cast<const char*>(sendbuf);
  for (size_t off = myLo; off < myHi; off += pieceElems) {
    const size_t len = std::min(pieceElems, myHi - off);
    const size_t at = off * esize;
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!readPeerMemory(pids[p], piece.get(), reinterpret_cast<const char*>(addrs[p].send) + at, len * esize))
        failAccess(p, "read");
      if (k == 1) {
        detail::reduceTo(out + at, own + at, piece.get(), len, dtype, op);
      } else {
        detail::reduceInto(out + at, piece.get(), len, dtype, op);
      }
    }
    detail::finishReduction(out + at, len, dtype, op, n);
    for (int k = 1; k < n; ++k) {
      const int p = (me + k) % n;
      if (!writePeerMemory(pids[p], reinterpret_cast<char*>(addrs[p].recv) + at, out + at, len * esize))
        failAccess(p, "write");
    }
  }

  // 3. Nobody may return (and let its caller reuse its buffers) while others still read
  //    or write them; after this barrier every slice has arrived everywhere.
  detail::disseminationBarrier(links);
}

}  // namespace kolo::comm::native
