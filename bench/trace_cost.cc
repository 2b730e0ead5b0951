// The fixed costs behind bench/timeline_overhead.sh, per call on one thread: a timeline span
// with the recorder off and on, a flight-recorder entry (begun started, then finished), and
// one read of the monotonic clock, which the span and the entry read twice each.
// Usage: trace_cost [CALLS]   (default 1000000)
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "kolo/flight_recorder.h"
#include "kolo/trace.h"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000000;
  auto perCall = [n](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::nano>(b - a).count() / n;
  };
  volatile int64_t sink = 0;
  auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) sink = sink + kolo::trace::nowNs();
  auto t1 = Clock::now();
  for (int i = 0; i < n; ++i) kolo::trace::Scope span("off", "bench");
  auto t2 = Clock::now();
  kolo::trace::start({.directory = "", .spansPerThread = static_cast<size_t>(n) + 1});
  { kolo::trace::Scope warm("first span: allocates this thread's buffer", "bench"); }
  auto t3 = Clock::now();
  for (int i = 0; i < n; ++i) kolo::trace::Scope span("on", "bench");
  auto t4 = Clock::now();
  kolo::trace::stop();
  kolo::flight::attach(0, 1);
  kolo::flight::Description d;
  d.op = "allreduce";
  d.dtype = "f32";
  d.reduce = "sum";
  d.algorithm = "auto";
  d.count = 16;
  d.bytes = 64;
  auto t5 = Clock::now();
  for (int i = 0; i < n; ++i) {
    d.seq = i;
    kolo::flight::finished(kolo::flight::begin(d, true));
  }
  auto t6 = Clock::now();
  std::printf("clock read %.1f ns, span off %.1f ns, span on %.1f ns, flight entry %.1f ns (%d calls)\n",
              perCall(t0, t1), perCall(t1, t2), perCall(t3, t4), perCall(t5, t6), n);
  return 0;
}
