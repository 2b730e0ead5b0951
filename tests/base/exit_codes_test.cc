// The public exit-code table and kolo::main: a program of one's own exits as `kolo` does
// (docs/exit_codes.md), so that a launcher tells a usage error from a lost peer.
#include "kolo/exit_codes.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>

#include "kolo/error.h"

namespace kolo {
namespace {

TEST(ExitCodes, EachKindHasItsRow) {
  EXPECT_EQ(exitCodeFor(InvalidArgument("FitOptions::batch must be at least 1")), kExitUsage);
  EXPECT_EQ(exitCodeFor(FileError("FitOptions::resumeDir x: no such directory")), kExitInputFile);
  EXPECT_EQ(exitCodeFor(FormatError("bad header")), kExitInputFile);
  EXPECT_EQ(exitCodeFor(DivergedError("loss nan")), kExitDiverged);
  EXPECT_EQ(exitCodeFor(ReplicaMismatch("rank 1 differs")), kExitOutOfSync);
  EXPECT_EQ(exitCodeFor(Mismatch("signature")), kExitJob);
  EXPECT_EQ(exitCodeFor(PeerError("rank 2 exited")), kExitJob);
  EXPECT_EQ(exitCodeFor(Timeout("allreduce #3")), kExitJob);
  EXPECT_EQ(exitCodeFor(IoError("disk full")), kExitSystem);
  EXPECT_EQ(exitCodeFor(InternalError("check failed")), kExitCheckFailed);
  EXPECT_EQ(exitCodeFor(std::runtime_error("other")), kExitInternal);
  EXPECT_EQ(exitCodeTable().back().code, kExitInternal);
}

TEST(ExitCodes, MainReturnsTheBodysCodeOrTheExceptionsAndSaysWhy) {
  char name[] = "/opt/bin/my_trainer";
  char* argv[] = {name, nullptr};
  EXPECT_EQ(main(1, argv, [](int argc, char**) { return argc == 1 ? 0 : 9; }), kExitOk);
  EXPECT_EQ(main(1, argv, [](int, char**) -> int { return 3; }), 3);
  testing::internal::CaptureStderr();
  const int usage = main(1, argv, [](int, char**) -> int {
    throw InvalidArgument("FitOptions::batch 100 does not split evenly over 3 replicas");
  });
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(usage, kExitUsage);
  EXPECT_EQ(said, "my_trainer: error: FitOptions::batch 100 does not split evenly over 3 replicas\n");
  EXPECT_EQ(main(1, argv, [](int, char**) -> int { throw PeerError("rank 2 exited"); }), kExitJob);
  EXPECT_EQ(main(1, argv, [](int, char**) -> int { throw 7; }), kExitInternal);
}

}  // namespace
}  // namespace kolo
