// Pairwise-exchange all-to-all, and its in-place variant over a round-robin tournament
// (circle method): in every round each rank has at most one partner and both swap the
// block meant for the other.
#include "comm/algorithms/alltoall.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace kolo::comm::detail {
namespace {

// Partner of rank r in round k of a round-robin over m (even) players; m - 1 is the pivot.
int roundRobinPartner(int r, int k, int m) {
  if (r == m - 1) return k;
  if (r == k) return m - 1;
  return mod(2 * k - r, m - 1);
}

}  // namespace

void alltoall(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, const AlgorithmOptions& opts) {
  const int n = links.size();
  const int r = links.rank();
  if (bytes == 0) return;
  char* dst = static_cast<char*>(recvbuf);
  const char* src = static_cast<const char*>(sendbuf);
  if (src != dst) {
    std::memcpy(dst + r * bytes, src + r * bytes, bytes);
    for (int s = 1; s < n; ++s) {
      const int to = mod(r + s, n);
      const int from = mod(r - s, n);
      auto send = links.isend(to, src + to * bytes, bytes);
      links.recv(from, dst + from * bytes, bytes);
      send->wait();
    }
    return;
  }
  // In place: swap block `partner` with the partner, a chunk at a time through scratch.
  const int m = n % 2 == 0 ? n : n + 1;  // odd n: a phantom player; its partner sits out
  const size_t chunk = std::min(bytes, std::max<size_t>(1, opts.chunkBytes));
  std::vector<char> scratch(chunk);
  for (int k = 0; k < m - 1; ++k) {
    const int partner = roundRobinPartner(r, k, m);
    if (partner >= n) continue;
    char* block = dst + partner * bytes;
    for (size_t off = 0; off < bytes; off += chunk) {
      const size_t len = std::min(chunk, bytes - off);
      auto send = links.isend(partner, block + off, len);
      links.recv(partner, scratch.data(), len);
      send->wait();  // the chunk must be out before its place is overwritten
      std::memcpy(block + off, scratch.data(), len);
    }
  }
}

}  // namespace kolo::comm::detail
