// The thread stacks of a flight-recorder dump: every thread of the process answers with its
// own frames, named (static functions included), and the hang report shortens them.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/thread_stacks.h"
#include "kolo/hang_report.h"

namespace {

std::mutex gMutex;
std::condition_variable gWake;
bool gRelease = false;
std::atomic<bool> gParked{false};

// A thread parked here must show this function in its stack.
__attribute__((noinline)) void parkedInAKnownFunction() {
  std::unique_lock<std::mutex> lock(gMutex);
  gParked = true;
  gWake.wait(lock, [] { return gRelease; });
  asm volatile("" ::: "memory");  // not a tail call
}

TEST(ThreadStacksTest, EveryThreadAnswersWithItsOwnNamedFrames) {
  std::thread parked(parkedInAKnownFunction);
  while (!gParked) std::this_thread::yield();
  const auto stacks = kolo::flight::detail::captureThreadStacks(std::chrono::milliseconds(2000));
  {
    std::lock_guard<std::mutex> lock(gMutex);
    gRelease = true;
  }
  gWake.notify_all();
  parked.join();

  ASSERT_GE(stacks.size(), 2u);
  bool sawParked = false, sawSelf = false;
  for (const auto& s : stacks) {
    EXPECT_TRUE(s.answered) << "thread " << s.tid << " (" << s.name << ") did not answer";
    std::string all;
    for (const auto& f : s.frames) all += f + "\n";
    if (all.find("parkedInAKnownFunction") != std::string::npos) {
      sawParked = true;
      // The handler's own frames are cut: the innermost frame is the wait, not the capture.
      EXPECT_EQ(all.find("onStackSignal"), std::string::npos) << all;
    }
    if (all.find("EveryThreadAnswersWithItsOwnNamedFrames") != std::string::npos) sawSelf = true;
  }
  EXPECT_TRUE(sawParked) << kolo::flight::detail::stacksJson(stacks);
  EXPECT_TRUE(sawSelf) << kolo::flight::detail::stacksJson(stacks);
  const auto json = nlohmann::json::parse(kolo::flight::detail::stacksJson(stacks));
  ASSERT_EQ(json.size(), stacks.size());
  EXPECT_EQ(json[0]["tid"], stacks[0].tid);
  EXPECT_TRUE(json[0]["frames"].is_array());
}

std::atomic<bool> gInHandler{false};
std::atomic<bool> gLeaveHandler{false};

void busyInAHandler(int) {
  gInHandler = true;
  while (!gLeaveHandler) {
  }
}

// A thread that runs another signal's handler when asked (as the flight recorder's SIGUSR1
// handler may be): its stack is what it was doing beneath the handler.
__attribute__((noinline)) void interruptedInAKnownFunction() {
  ::raise(SIGUSR2);  // to this thread
  asm volatile("" ::: "memory");
}

TEST(ThreadStacksTest, AThreadInsideAnotherHandlerShowsWhatItWasDoing) {
  struct sigaction action {}, old {};
  action.sa_handler = busyInAHandler;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(SIGUSR2, &action, &old), 0);
  std::thread busy(interruptedInAKnownFunction);
  while (!gInHandler) std::this_thread::yield();
  const auto stacks = kolo::flight::detail::captureThreadStacks(std::chrono::milliseconds(2000));
  gLeaveHandler = true;
  busy.join();
  ::sigaction(SIGUSR2, &old, nullptr);
  bool found = false;
  for (const auto& s : stacks) {
    std::string all;
    for (const auto& f : s.frames) all += f + "\n";
    if (all.find("interruptedInAKnownFunction") == std::string::npos) continue;
    found = true;
    EXPECT_EQ(all.find("busyInAHandler"), std::string::npos) << all;
  }
  EXPECT_TRUE(found) << kolo::flight::detail::stacksJson(stacks);
}

TEST(ThreadStacksTest, ShortStackDropsArgumentsVersionsAndModules) {
  kolo::observe::DumpedStack stack;
  stack.frames = {"clock_nanosleep@GLIBC_2.2.5 (libc.so.6)", "ns::Type::run(int, std::function<void ()>) [clone .cold] (prog)",
                  "(anonymous namespace)::helper(char const*) (prog)", "main (prog)"};
  EXPECT_EQ(kolo::observe::shortStack(stack),
            "clock_nanosleep < ns::Type::run [clone .cold] < (anonymous namespace)::helper < main");
  EXPECT_EQ(kolo::observe::shortStack(stack, 2), "clock_nanosleep < ns::Type::run [clone .cold] < ...");
}

}  // namespace
