// The parameter-server wire protocol as each side reads it from its peer. The peer's bytes
// are written into one end of a socketpair (no network) and read from the other by the
// functions of src/parallel/ps/wire.cc, as the first byte says: 0, a server (the hello, then
// requests checked by checkServerRequest, their payloads, the basis of pushes); 1, the
// chief's dispatcher (the hello, then unit requests checked by checkUnitRequest); 2, a worker
// (the reply to its hello, then the chief's answers: units checked by checkUnitReply, error
// texts). Each side reads until the bytes run out, which ends in a kolo::Error.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.h"
#include "kolo/error.h"
#include "parallel/ps/wire.h"

using namespace kolo::parallel::ps::detail;

namespace {

const std::string kToken = "job-token";
constexpr uint64_t kPushBytes = 16;  // a server of 4 f32 elements
constexpr int64_t kVersion = 7;
constexpr int64_t kUnitSamples = 8;

void serve(Socket& socket, Clock::time_point deadline) {
  acceptHello(socket, kToken, deadline);
  for (;;) {
    const Header h = recvHeader(socket, deadline, "a request");
    checkServerRequest(h, kPushBytes, socket.peer(), "parameter server 0");
    KOLO_FUZZ_REQUIRE(h.payload <= sizeof(uint64_t) + kMaxTextBytes);
    std::string payload(h.payload, '\0');
    socket.recvAll(payload.data(), payload.size(), deadline, "the payload");
    if (h.op == static_cast<uint32_t>(Op::Push)) {
      KOLO_FUZZ_REQUIRE(h.payload == kPushBytes);
      const int64_t staleness = stalenessOf(kVersion, h.a, socket.peer(), "parameter server 0");
      KOLO_FUZZ_REQUIRE(staleness >= 0 && staleness <= kVersion);
    }
  }
}

void dispatch(Socket& socket, Clock::time_point deadline) {
  acceptHello(socket, kToken, deadline);
  int64_t held = -1, next = 0;
  for (;;) {
    const Header h = recvHeader(socket, deadline, "a unit request");
    checkUnitRequest(h, held, kUnitSamples, socket.peer());
    KOLO_FUZZ_REQUIRE(h.payload == sizeof(double));
    KOLO_FUZZ_REQUIRE(h.a == -1 || (h.a == held && h.b >= 0 && h.b <= kUnitSamples));
    double lossSum = 0;
    socket.recvAll(&lossSum, sizeof lossSum, deadline, "the unit report");
    held = next++;  // the chief hands out the next unit
  }
}

void work(Socket& socket, Clock::time_point deadline) {
  hello(socket, 3, 0, kToken, deadline);
  for (;;) {
    const Header h = recvHeader(socket, deadline, "the next unit");
    if (h.op == static_cast<uint32_t>(Status::Error)) throwRemoteError(socket, h, deadline);
    if (h.op != static_cast<uint32_t>(Status::Ok) || h.payload != 2 * sizeof(int64_t)) continue;
    int64_t range[2];
    socket.recvAll(range, sizeof range, deadline, "the next unit");
    checkUnitReply(h, range, socket.peer());
    KOLO_FUZZ_REQUIRE(h.a >= 0 && h.b >= 0 && range[0] >= 0 && range[0] <= range[1]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return 0;
  // The peer's bytes wait in the socket (those that fit), then its end of the stream.
  ::fcntl(fds[1], F_SETFL, O_NONBLOCK);
  const ssize_t written = ::write(fds[1], data + 1, size - 1);
  (void)written;
  ::shutdown(fds[1], SHUT_WR);
  Socket socket(fds[0], "the fuzzer");
  const auto deadline = deadlineAfter(std::chrono::seconds(5));
  try {
    switch (data[0] % 3) {
      case 0:
        serve(socket, deadline);
        break;
      case 1:
        dispatch(socket, deadline);
        break;
      default:
        work(socket, deadline);
    }
  } catch (const kolo::Error&) {
  }
  ::close(fds[1]);
  return 0;
}
