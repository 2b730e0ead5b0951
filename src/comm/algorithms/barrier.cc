// Dissemination barrier.
#include "comm/algorithms/barrier.h"

#include "comm/algorithms/pipeline.h"

namespace kolo::comm::detail {

void disseminationBarrier(Links& links) {
  const int n = links.size();
  const int r = links.rank();
  for (int dist = 1; dist < n; dist *= 2) {
    const char token = 1;
    char incoming = 0;
    auto send = links.isend(mod(r + dist, n), &token, 1);
    links.recv(mod(r - dist, n), &incoming, 1);
    send->wait();
  }
}

}  // namespace kolo::comm::detail
