// Recursive halving-doubling all-reduce with the "fold the extra ranks in first" scheme
// for group sizes that are not powers of two. Ranks of the power-of-two core are
// renumbered v = 0..p-1; an even rank r < 2(n - p) hands its vector to r + 1 and waits.
#include "comm/algorithms/halving_doubling.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

// Whole-vector exchanges: log2 p steps, scratch of one vector (small messages only).
void recursiveDoubling(Links& links, int vrank, int p, int extra, const char* src, char* dst, size_t count,
                       DType dtype, ReduceOp op) {
  const size_t bytes = count * dtypeSize(dtype);
  auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  std::vector<char> incoming(bytes);
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partnerV = vrank ^ mask;
    const int partner = real(partnerV);
    auto send = links.isend(partner, src, bytes);
    links.recv(partner, incoming.data(), bytes);
    send->wait();  // src may be dst: it must not change while being sent
    if (vrank < partnerV) {
      reduceTo(dst, src, incoming.data(), count, dtype, op);
    } else {
      reduceTo(dst, incoming.data(), src, count, dtype, op);
    }
    src = dst;
  }
  if (src != dst) std::memcpy(dst, src, bytes);
}

// Reduce-scatter by recursive halving, then all-gather by recursive doubling.
void halvingDoubling(Links& links, int vrank, int p, int extra, const char* src, char* dst, size_t count,
                     DType dtype, ReduceOp op, int n, const AlgorithmOptions& opts) {
  const size_t esize = dtypeSize(dtype);
  auto real = [extra](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  const Blocks blocks = evenBlocks(count, p);
  auto rangeOff = [&](int lo) { return blocks.offset[lo]; };
  auto rangeLen = [&](int lo, int hi) { return (hi < p ? blocks.offset[hi] : count) - blocks.offset[lo]; };
  const size_t chunkBytes = chunkElements(opts, esize) * esize;

  SendQueue sends(links);
  int lo = 0, hi = p;  // blocks [lo, hi) are this rank's responsibility
  for (int mask = p / 2; mask >= 1; mask /= 2) {
    const int partnerV = vrank ^ mask;
    const int partner = real(partnerV);
    const int mid = lo + (hi - lo) / 2;
    const bool keepLow = (vrank & mask) == 0;
    const int sendLo = keepLow ? mid : lo, sendHi = keepLow ? hi : mid;
    const int keepLo = keepLow ? lo : mid, keepHi = keepLow ? mid : hi;
    // The half sent and the half kept are disjoint, so sending from src while reducing
    // into dst is safe even in place.
    sends.postChunks(partner, src + rangeOff(sendLo) * esize, rangeLen(sendLo, sendHi) * esize, chunkBytes);
    const size_t keepOff = rangeOff(keepLo) * esize;
    recvReduceChunks(links, partner, dst + keepOff, src + keepOff, rangeLen(keepLo, keepHi), dtype, op,
                     /*incomingFirst=*/partnerV < vrank, opts);
    lo = keepLo;
    hi = keepHi;
    src = dst;
  }
  if (src != dst) std::memcpy(dst, src, count * esize);  // p == 1 only
  finishReduction(dst + rangeOff(lo) * esize, rangeLen(lo, hi), dtype, op, n);
  // Halves sent above return below into the same places: wait before overwriting them.
  sends.waitAll();

  for (int mask = 1; mask < p; mask <<= 1) {
    const int partnerV = vrank ^ mask;
    const int partner = real(partnerV);
    const int partnerLo = lo ^ mask;  // the partner's range mirrors ours across the bit
    const int partnerHi = partnerLo + (hi - lo);
    sends.postChunks(partner, dst + rangeOff(lo) * esize, rangeLen(lo, hi) * esize, chunkBytes);
    recvChunks(links, partner, dst + rangeOff(partnerLo) * esize, rangeLen(partnerLo, partnerHi) * esize, chunkBytes,
               opts.window);
    lo = std::min(lo, partnerLo);
    hi = lo + 2 * mask;
  }
  sends.waitAll();
}

}  // namespace

void halvingDoublingAllreduce(Links& links, const void* sendbuf, void* recvbuf, size_t count, DType dtype,
                              ReduceOp op, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  const size_t esize = dtypeSize(dtype);
  const size_t bytes = count * esize;
  const char* src = static_cast<const char*>(sendbuf);
  char* dst = static_cast<char*>(recvbuf);
  if (count == 0) return;
  if (n == 1) {
    if (src != dst) std::memcpy(dst, src, bytes);
    return;
  }
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  const size_t chunkBytes = chunkElements(opts, esize) * esize;

  int vrank;
  if (r < 2 * extra) {
    if (r % 2 == 0) {
      // Folded out: contribute to r + 1, then receive the finished result from it.
      SendQueue sends(links);
      sends.postChunks(r + 1, src, bytes, chunkBytes);
      sends.waitAll();  // src may be dst, which the result overwrites
      recvChunks(links, r + 1, dst, bytes, chunkBytes, opts.window);
      return;
    }
    recvReduceChunks(links, r - 1, dst, src, count, dtype, op, /*incomingFirst=*/true, opts);
    src = dst;
    vrank = r / 2;
  } else {
    vrank = r - extra;
  }

  if (bytes <= opts.recursiveDoublingBytes || count < static_cast<size_t>(p)) {
    recursiveDoubling(links, vrank, p, extra, src, dst, count, dtype, op);
    finishReduction(dst, count, dtype, op, n);
  } else {
    halvingDoubling(links, vrank, p, extra, src, dst, count, dtype, op, n, opts);
  }

  if (r < 2 * extra) {  // odd fold partner: hand the result back
    SendQueue sends(links);
    sends.postChunks(r - 1, dst, bytes, chunkBytes);
    sends.waitAll();
  }
}

}  // namespace kolo::comm::detail
