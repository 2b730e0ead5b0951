// Names and descriptions of frame signatures, for Mismatch messages.
#include "comm/native/frame.h"

#include <sstream>

namespace kolo::comm::native {

const char* collectiveName(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::None: return "message";
    case CollectiveKind::Allreduce: return "allreduce";
    case CollectiveKind::Reduce: return "reduce";
    case CollectiveKind::Broadcast: return "broadcast";
    case CollectiveKind::Allgather: return "allgather";
    case CollectiveKind::Allgatherv: return "allgatherv";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::Gather: return "gather";
    case CollectiveKind::Scatter: return "scatter";
    case CollectiveKind::Alltoall: return "alltoall";
    case CollectiveKind::Barrier: return "barrier";
    case CollectiveKind::Split: return "split";
  }
  return "unknown";
}

std::string describeSignature(const Signature& sig) {
  std::ostringstream out;
  const bool reduces = sig.collective == CollectiveKind::Allreduce || sig.collective == CollectiveKind::Reduce ||
                       sig.collective == CollectiveKind::ReduceScatter;
  const bool rooted = sig.collective == CollectiveKind::Reduce || sig.collective == CollectiveKind::Broadcast ||
                      sig.collective == CollectiveKind::Gather || sig.collective == CollectiveKind::Scatter;
  if (sig.collective == CollectiveKind::Barrier) {
    out << "barrier";
  } else {
    out << dtypeName(sig.dtype);
    if (reduces) out << " " << reduceOpName(sig.op);
    out << " count=" << sig.count;
    if (rooted) out << " root=" << sig.root;
  }
  if (sig.algorithm != Algorithm::Auto) out << " " << algorithmName(sig.algorithm);
  return out.str();
}

}  // namespace kolo::comm::native
