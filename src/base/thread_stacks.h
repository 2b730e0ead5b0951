// The stacks of this process's threads, for the flight recorder's dumps: what each thread
// was doing when a rank wrote its ring (a hang's "what it was doing instead"). Each thread
// records its own return addresses in a signal handler; the caller turns them into names.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace kolo::flight::detail {

/// One thread's stack, innermost frame first ("function (module)" or "0xADDR (module)").
struct ThreadStack {
  int tid = 0;
  std::string name;  // /proc/self/task/TID/comm
  bool answered = false;  // false: the thread did not take the signal in time (frames empty)
  std::vector<std::string> frames;
};

/// Installs the handler of the stack signal (SIGRTMIN + 4) and loads the unwinder, so that a
/// later capture allocates nothing in a signal handler. Safe to call more than once.
void prepareStackCapture();

/// The stacks of up to `maxThreads` threads of this process, the calling thread's included
/// (without its own capture frames), waiting at most `perThread` for each. Threads that block
/// the signal or are stopped are listed unanswered. Calls must not overlap (the caller holds
/// a lock). Never throws.
std::vector<ThreadStack> captureThreadStacks(std::chrono::milliseconds perThread, int maxThreads = 64);

/// The stacks as a JSON array: [{"tid":..,"name":"..","answered":true,"frames":["..",..]},...].
std::string stacksJson(const std::vector<ThreadStack>& stacks);

}  // namespace kolo::flight::detail
