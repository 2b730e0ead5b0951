// Wire format of the native transports: every message travels as one 64-byte header
// followed by its payload. The header carries the collective's sequence number and
// signature so a receiver can tell a disagreeing peer from a late one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::native {

inline constexpr uint32_t kFrameMagic = 0x4b4f4c4fu;  // "KOLO"

/// Abort: the sender gave up on the job's collectives; its payload (at most kMaxAbortBytes)
/// says why (the first rank that left, as the sender saw it, or the disagreement it found),
/// and its tag is the GaveUp that names the kind of cause.
enum class FrameKind : uint8_t { Collective = 1, PointToPoint = 2, Abort = 3 };
inline constexpr uint64_t kMaxAbortBytes = 4096;

/// Why a rank gave up on the job's collectives (an Abort frame's tag), which decides the
/// error its peers fail with: PeerError, Timeout or Mismatch. An elastic job regroups after
/// the first two; ranks that disagree on what they call are not mended by a regroup.
enum class GaveUp : int32_t { PeerLost = 0, TimedOut = 1, Disagreed = 2 };

/// Which collective a frame belongs to (part of the signature).
enum class CollectiveKind : uint8_t {
  None,
  Allreduce,
  Reduce,
  Broadcast,
  Allgather,
  Allgatherv,
  ReduceScatter,
  Gather,
  Scatter,
  Alltoall,
  Barrier,
  Split,
};

const char* collectiveName(CollectiveKind kind);

/// What a rank believes the current operation is; compared field by field on receipt.
struct Signature {
  CollectiveKind collective = CollectiveKind::None;
  DType dtype = DType::U8;
  ReduceOp op = ReduceOp::Sum;
  Algorithm algorithm = Algorithm::Auto;
  int32_t root = -1;
  uint64_t count = 0;

  bool operator==(const Signature&) const = default;
};

/// "f32 sum count=1000 root=0 ring" (only the fields that matter for the collective).
std::string describeSignature(const Signature& sig);

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint8_t kind = 0;
  uint8_t collective = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t algorithm = 0;
  uint8_t reserved0[3] = {0, 0, 0};
  uint32_t context = 0;
  int32_t root = -1;
  int32_t tag = 0;
  uint64_t seq = 0;
  uint64_t count = 0;
  uint64_t length = 0;  // payload bytes that follow
  uint8_t reserved2[16] = {};

  Signature signature() const {
    Signature s;
    s.collective = static_cast<CollectiveKind>(collective);
    s.dtype = static_cast<DType>(dtype);
    s.op = static_cast<ReduceOp>(op);
    s.algorithm = static_cast<Algorithm>(algorithm);
    s.root = root;
    s.count = count;
    return s;
  }
  void setSignature(const Signature& s) {
    collective = static_cast<uint8_t>(s.collective);
    dtype = static_cast<uint8_t>(s.dtype);
    op = static_cast<uint8_t>(s.op);
    algorithm = static_cast<uint8_t>(s.algorithm);
    root = s.root;
    count = s.count;
  }
};
static_assert(sizeof(FrameHeader) == 64, "frame header must stay 64 bytes");

/// Largest payload a receiver buffers for a message nobody has asked for yet; a header
/// announcing more is treated as corrupt (bytes from the network are untrusted).
inline constexpr uint64_t kMaxUnexpectedBytes = uint64_t{1} << 32;
/// Largest payload any frame may announce.
inline constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 40;

/// Checks a header that arrived from a peer: the magic, a known frame kind, collective,
/// dtype, reduce op and algorithm, and a length of at most kMaxFrameBytes. Throws
/// FormatError naming the first field that is wrong. Whether the header matches what the
/// receiver expects is a separate question (Mismatch, decided by the engine).
void checkFrameHeader(const FrameHeader& header);

/// Copies a header out of `size` bytes from the wire (exactly sizeof(FrameHeader)) and
/// checks it as checkFrameHeader does; throws FormatError when either fails.
FrameHeader parseFrameHeader(const uint8_t* data, size_t size);

}  // namespace kolo::comm::native
