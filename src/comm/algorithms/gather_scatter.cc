// Flat gather and scatter.
#include "comm/algorithms/gather_scatter.h"

#include <cstring>
#include <vector>

#include "kolo/error.h"

namespace kolo::comm::detail {

void gather(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root) {
  const int n = links.size();
  const int r = links.rank();
  KOLO_CHECK(root >= 0 && root < n, "gather root ", root, " outside group of ", n);
  if (bytes == 0) return;
  if (r != root) {
    links.send(root, sendbuf, bytes);
    return;
  }
  char* dst = static_cast<char*>(recvbuf);
  if (sendbuf != dst + r * bytes) std::memmove(dst + r * bytes, sendbuf, bytes);
  std::vector<std::unique_ptr<Work>> posted;
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) posted.push_back(links.irecv(peer, dst + peer * bytes, bytes));
  for (auto& w : posted) w->wait();
}

void scatter(Links& links, const void* sendbuf, void* recvbuf, size_t bytes, int root) {
  const int n = links.size();
  const int r = links.rank();
  KOLO_CHECK(root >= 0 && root < n, "scatter root ", root, " outside group of ", n);
  if (bytes == 0) return;
  if (r != root) {
    links.recv(root, recvbuf, bytes);
    return;
  }
  const char* src = static_cast<const char*>(sendbuf);
  SendQueue sends(links);
  for (int peer = 0; peer < n; ++peer)
    if (peer != root) sends.post(peer, src + peer * bytes, bytes);
  if (recvbuf != src + r * bytes) std::memmove(recvbuf, src + r * bytes, bytes);
  sends.waitAll();
}

}  // namespace kolo::comm::detail
