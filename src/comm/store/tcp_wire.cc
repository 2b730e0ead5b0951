// Parsing of the TCP store's request and reply bodies (tcp_wire.h), apart from the socket
// code so that both directions can be checked byte for byte by tests and fuzzers.
#include "comm/store/tcp_wire.h"

#include "kolo/comm/stores.h"

namespace kolo::comm::detail {
namespace {

std::string readKey(WireReader& in, size_t maxKeyBytes) {
  std::string key = in.str(maxKeyBytes);
  if (key.empty()) KOLO_THROW(FormatError, "empty key");
  return key;
}

/// A key count read from the wire, refused before any allocation when the rest of the
/// body cannot hold that many strings (each has at least its 4-byte length).
uint32_t readCount(WireReader& in) {
  uint32_t count = in.u32();
  if (count > in.remaining() / 4)
    KOLO_THROW(FormatError, "count of ", count, " strings in ", in.remaining(), " bytes");
  return count;
}

}  // namespace

StoreRequest parseStoreRequest(const uint8_t* body, size_t size, bool authenticated,
                               size_t maxKeyBytes, size_t maxValueBytes) {
  WireReader in(body, size);
  StoreRequest request;
  const uint8_t opcode = in.u8();
  request.op = static_cast<StoreOp>(opcode);
  if (!authenticated) {
    if (request.op != StoreOp::Hello)
      KOLO_THROW(FormatError, "opcode ", int(opcode), " before Hello");
    const uint32_t magic = in.u32();
    const uint8_t version = in.u8();
    if (magic != kTcpStoreMagic || version != kTcpStoreVersion)
      KOLO_THROW(FormatError, "Hello with magic 0x", std::hex, magic, std::dec, " version ",
                 int(version));
    request.token = in.str(kMaxHelloFrame);
    in.expectEnd();
    return request;
  }
  switch (request.op) {
    case StoreOp::Set:
      request.keys.push_back(readKey(in, maxKeyBytes));
      request.value = in.bytes(maxValueBytes);
      break;
    case StoreOp::Get:
      request.keys.push_back(readKey(in, maxKeyBytes));
      request.timeoutMs = in.u64();
      break;
    case StoreOp::Wait: {
      const uint32_t count = readCount(in);
      for (uint32_t i = 0; i < count; ++i) request.keys.push_back(readKey(in, maxKeyBytes));
      request.timeoutMs = in.u64();
      break;
    }
    case StoreOp::Add:
      request.keys.push_back(readKey(in, maxKeyBytes));
      request.delta = static_cast<int64_t>(in.u64());
      break;
    case StoreOp::Remove:
      request.keys.push_back(readKey(in, maxKeyBytes));
      break;
    case StoreOp::Check:
    case StoreOp::CheckEach: {
      const uint32_t count = readCount(in);
      for (uint32_t i = 0; i < count; ++i) request.keys.push_back(readKey(in, maxKeyBytes));
      break;
    }
    case StoreOp::MultiGet:
    case StoreOp::GetAvailable: {
      const uint32_t count = readCount(in);
      for (uint32_t i = 0; i < count; ++i) request.keys.push_back(readKey(in, maxKeyBytes));
      request.timeoutMs = in.u64();
      break;
    }
    case StoreOp::MultiSet: {
      // Each pair is at least two 4-byte lengths.
      const uint32_t count = readCount(in);
      if (count > in.remaining() / 8)
        KOLO_THROW(FormatError, "count of ", count, " key-value pairs in ", in.remaining(), " bytes");
      for (uint32_t i = 0; i < count; ++i) {
        request.keys.push_back(readKey(in, maxKeyBytes));
        request.values.push_back(in.bytes(maxValueBytes));
      }
      break;
    }
    case StoreOp::CompareSet:
      request.keys.push_back(readKey(in, maxKeyBytes));
      request.expected = in.bytes(maxValueBytes);
      request.value = in.bytes(maxValueBytes);
      break;
    case StoreOp::Arrive:
      request.keys.push_back(readKey(in, maxKeyBytes));
      request.delta = static_cast<int64_t>(in.u64());
      request.arrivals = static_cast<int64_t>(in.u64());
      // A host store counts at most its ranks in one request; anything else is not a client.
      if (request.arrivals < 1 || request.arrivals > INT32_MAX)
        KOLO_THROW(FormatError, "barrier request counting ", request.arrivals, " arrivals");
      request.timeoutMs = in.u64();
      break;
    default:
      KOLO_THROW(FormatError, "unknown opcode ", int(opcode));
  }
  in.expectEnd();
  return request;
}

bool storeOpWaits(StoreOp op) {
  return op == StoreOp::Get || op == StoreOp::Wait || op == StoreOp::MultiGet || op == StoreOp::Arrive;
}

StoreReply parseStoreReply(StoreOp op, const uint8_t* body, size_t size) {
  WireReader in(body, size);
  StoreReply reply;
  const uint8_t status = in.u8();
  reply.status = static_cast<StoreStatus>(status);
  switch (reply.status) {
    case StoreStatus::Error:
      reply.message = in.str(kMaxStoreValueBytes);
      break;
    case StoreStatus::Timeout: {
      if (!storeOpWaits(op))
        KOLO_THROW(FormatError, "Timeout status in the reply to opcode ", int(op));
      const uint32_t count = readCount(in);
      for (uint32_t i = 0; i < count; ++i) reply.missing.push_back(in.str(kMaxStoreKeyBytes));
      break;
    }
    case StoreStatus::Ok:
      switch (op) {
        case StoreOp::Get:
          reply.value = in.bytes(kMaxStoreValueBytes);
          break;
        case StoreOp::Add:
        case StoreOp::Arrive:
          reply.counter = static_cast<int64_t>(in.u64());
          break;
        case StoreOp::CompareSet:
          reply.value = in.bytes(kMaxStoreValueBytes);
          break;
        case StoreOp::MultiGet: {
          const uint32_t count = readCount(in);
          for (uint32_t i = 0; i < count; ++i) reply.values.push_back(in.bytes(kMaxStoreValueBytes));
          break;
        }
        case StoreOp::GetAvailable: {
          // Each answer is at least its presence byte.
          const uint32_t count = in.u32();
          if (count > in.remaining())
            KOLO_THROW(FormatError, "count of ", count, " answers in ", in.remaining(), " bytes");
          for (uint32_t i = 0; i < count; ++i) {
            const bool present = in.u8() != 0;
            reply.present.push_back(present);
            reply.values.push_back(present ? in.bytes(kMaxStoreValueBytes) : Bytes{});
          }
          break;
        }
        case StoreOp::CheckEach: {
          const uint32_t count = in.u32();
          if (count > in.remaining())
            KOLO_THROW(FormatError, "count of ", count, " flags in ", in.remaining(), " bytes");
          for (uint32_t i = 0; i < count; ++i) reply.present.push_back(in.u8() != 0);
          break;
        }
        case StoreOp::Remove:
        case StoreOp::Check:
          reply.flag = in.u8() != 0;
          break;
        default:
          break;
      }
      break;
    default:
      KOLO_THROW(FormatError, "unknown reply status ", int(status));
  }
  in.expectEnd();
  return reply;
}

}  // namespace kolo::comm::detail
