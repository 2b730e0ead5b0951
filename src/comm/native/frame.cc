// Names and descriptions of frame signatures, for Mismatch messages, and the check of
// headers that arrive from peers.
#include "comm/native/frame.h"

#include <cstring>
#include <sstream>

#include "kolo/error.h"

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

void checkFrameHeader(const FrameHeader& h) {
  // The enum fields are compared as bytes: a value outside the enum must not reach the
  // switches that name it (dtypeSize throws on one, the others print "unknown").
  if (h.magic != kFrameMagic) KOLO_THROW(FormatError, "bad magic 0x", std::hex, h.magic);
  if (h.kind < static_cast<uint8_t>(FrameKind::Collective) || h.kind > static_cast<uint8_t>(FrameKind::Abort))
    KOLO_THROW(FormatError, "unknown frame kind ", int(h.kind));
  if (h.kind == static_cast<uint8_t>(FrameKind::Abort) && h.length > kMaxAbortBytes)
    KOLO_THROW(FormatError, "abort message of ", h.length, " bytes");
  if (h.collective > static_cast<uint8_t>(CollectiveKind::Split))
    KOLO_THROW(FormatError, "unknown collective ", int(h.collective));
  if (h.dtype > static_cast<uint8_t>(DType::U8)) KOLO_THROW(FormatError, "unknown dtype ", int(h.dtype));
  if (h.op > static_cast<uint8_t>(ReduceOp::Avg)) KOLO_THROW(FormatError, "unknown reduce op ", int(h.op));
  if (h.algorithm > static_cast<uint8_t>(Algorithm::Hierarchical))
    KOLO_THROW(FormatError, "unknown algorithm ", int(h.algorithm));
  if (h.length > kMaxFrameBytes) KOLO_THROW(FormatError, "length ", h.length);
}

FrameHeader parseFrameHeader(const uint8_t* data, size_t size) {
  FrameHeader header;
  if (size != sizeof header)
    KOLO_THROW(FormatError, "frame header of ", size, " bytes, expected ", sizeof header);
  std::memcpy(&header, data, sizeof header);
  checkFrameHeader(header);
  return header;
}

}  // namespace kolo::comm::native
