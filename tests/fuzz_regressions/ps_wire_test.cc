// The parameter-server wire checks, fed the fuzzer's seeds and the inputs that once reached
// undefined behaviour (a push computed on version -2^63 overflowed the staleness, a unit
// report of 2^63 - 1 batches overflowed the epoch's count, a unit [40, 8) indexed the sample
// order out of bounds), and each check's refusals.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>

#include "fuzz_regressions/fuzz_inputs.h"
#include "parallel/ps/wire.h"

namespace kolo::fuzz_regressions {
namespace {

using namespace parallel::ps::detail;

/// Reads `b` (the harness's format: a mode byte, then the peer's bytes) as the server (0),
/// the chief (1) or a worker (2) does, until the bytes run out (PeerError) or a check fails.
void readAsPeer(const std::vector<uint8_t>& b) {
  if (b.empty()) throw FormatError("empty input");
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  ASSERT_EQ(::write(fds[1], b.data() + 1, b.size() - 1), static_cast<ssize_t>(b.size() - 1));
  ::shutdown(fds[1], SHUT_WR);
  struct CloseWriter {
    int fd;
    ~CloseWriter() { ::close(fd); }
  } closeWriter{fds[1]};
  Socket socket(fds[0], "the test's peer");
  const auto deadline = deadlineAfter(std::chrono::seconds(10));
  const int mode = b[0] % 3;
  if (mode == 2) {
    hello(socket, 3, 0, "job-token", deadline);
  } else {
    acceptHello(socket, "job-token", deadline);
  }
  for (int64_t held = -1, next = 0;; held = next++) {
    const Header h = recvHeader(socket, deadline, "a message");
    if (mode == 0) {
      checkServerRequest(h, 16, socket.peer(), "server 0");
      std::string payload(h.payload, '\0');
      socket.recvAll(payload.data(), payload.size(), deadline, "the payload");
      if (h.op == static_cast<uint32_t>(Op::Push)) stalenessOf(7, h.a, socket.peer(), "server 0");
    } else if (mode == 1) {
      checkUnitRequest(h, held, 8, socket.peer());
      double lossSum = 0;
      socket.recvAll(&lossSum, sizeof lossSum, deadline, "the unit report");
    } else if (h.op == static_cast<uint32_t>(Status::Error)) {
      throwRemoteError(socket, h, deadline);
    } else if (h.op == static_cast<uint32_t>(Status::Ok) && h.payload == 16) {
      int64_t range[2];
      socket.recvAll(range, sizeof range, deadline, "the unit");
      checkUnitReply(h, range, socket.peer());
    }
  }
}

TEST(PsWireTest, SeedsAreReadToTheirEndAndRegressionsRefused) {
  // Every input ends: a seed when its bytes run out (PeerError: the peer closed) or its peer
  // reports an error, a regression when a check refuses it.
  const auto seeds = seedInputs("ps_wire");
  ASSERT_FALSE(seeds.empty());
  for (const Input& input : seeds) {
    SCOPED_TRACE(input.name);
    EXPECT_THROW(readAsPeer(input.bytes), PeerError);
  }
  const auto regressions = regressionInputs("ps_wire");
  ASSERT_FALSE(regressions.empty());
  for (const Input& input : regressions) {
    SCOPED_TRACE(input.name);
    formatErrorOf([&] { readAsPeer(input.bytes); });
  }
}

TEST(PsWireTest, ServerRequestsCarryWhatTheirOperationTakes) {
  const auto refused = [](Op op, uint64_t payload) {
    return formatErrorOf([&] { checkServerRequest(request(op, 0, 0, payload), 16, "worker 1", "server 0"); });
  };
  checkServerRequest(request(Op::Push, 0, 0, 16), 16, "worker 1", "server 0");
  checkServerRequest(request(Op::Share, 0, 0, 8 + 5), 16, "worker 1", "server 0");
  EXPECT_NE(refused(Op::Push, 17).find("pushed 17 bytes to server 0, which takes 16"), std::string::npos);
  EXPECT_NE(refused(Op::Pull, 1).find("sent 1 bytes with request 2"), std::string::npos);
  EXPECT_NE(refused(Op::Checkpoint, kMaxTextBytes + 1).find("checkpoint path"), std::string::npos);
  EXPECT_NE(refused(Op::Restore, kMaxTextBytes + 1).find("checkpoint path"), std::string::npos);
  EXPECT_NE(refused(Op::Share, 7).find("share request of 7 bytes"), std::string::npos);
  EXPECT_NE(refused(Op::Hello, 0).find("unknown request 1"), std::string::npos);
  EXPECT_NE(refused(static_cast<Op>(99), 0).find("unknown request 99"), std::string::npos);
}

TEST(PsWireTest, APushsBasisIsAVersionTheServerHad) {
  EXPECT_EQ(stalenessOf(7, 7, "worker 1", "server 0"), 0);
  EXPECT_EQ(stalenessOf(7, 0, "worker 1", "server 0"), 7);
  for (int64_t basis : {int64_t{8}, int64_t{-1}, INT64_MIN, INT64_MAX})
    EXPECT_NE(formatErrorOf([&] { stalenessOf(7, basis, "worker 1", "server 0"); })
                  .find("computed on version " + std::to_string(basis)),
              std::string::npos);
}

TEST(PsWireTest, AUnitReportNamesTheHeldUnitAndAtMostOneBatchPerSample) {
  checkUnitRequest(request(Op::Next, -1, 0, 8), -1, 8, "worker 1");
  checkUnitRequest(request(Op::Next, 3, 8, 8), 3, 8, "worker 1");
  EXPECT_NE(formatErrorOf([] { checkUnitRequest(request(Op::Next, 5, 1, 8), -1, 8, "worker 1"); })
                .find("reported unit 5 done, but it holds none"),
            std::string::npos);
  EXPECT_NE(formatErrorOf([] { checkUnitRequest(request(Op::Next, 3, INT64_MAX, 8), 3, 8, "worker 1"); })
                .find("batches for unit 3"),
            std::string::npos);
  formatErrorOf([] { checkUnitRequest(request(Op::Next, 3, -1, 8), 3, 8, "worker 1"); });
  formatErrorOf([] { checkUnitRequest(request(Op::Next, -2, 0, 8), -1, 8, "worker 1"); });
  formatErrorOf([] { checkUnitRequest(request(Op::Push, -1, 0, 8), -1, 8, "worker 1"); });
  formatErrorOf([] { checkUnitRequest(request(Op::Next, -1, 0, 9), -1, 8, "worker 1"); });
}

TEST(PsWireTest, AUnitIsARangeOfSamples) {
  const Header unit = reply(Status::Ok, 4, 1, 16);
  const int64_t ok[2] = {32, 40}, empty[2] = {8, 8}, backwards[2] = {40, 8}, negative[2] = {-5, 3};
  checkUnitReply(unit, ok, "the chief");
  checkUnitReply(unit, empty, "the chief");
  EXPECT_NE(formatErrorOf([&] { checkUnitReply(unit, backwards, "the chief"); }).find("samples [40, 8)"),
            std::string::npos);
  formatErrorOf([&] { checkUnitReply(unit, negative, "the chief"); });
  formatErrorOf([&] { checkUnitReply(reply(Status::Ok, -1, 1, 16), ok, "the chief"); });
  formatErrorOf([&] { checkUnitReply(reply(Status::Ok, 4, -1, 16), ok, "the chief"); });
}

}  // namespace
}  // namespace kolo::fuzz_regressions
