// What every harness checks besides "no crash": a parser either throws a kolo::Error or
// returns a result whose invariants hold. A broken invariant aborts, which libFuzzer
// reports as a crash and saves the input.
#pragma once

#include <cstdio>
#include <cstdlib>

#define KOLO_FUZZ_REQUIRE(cond)                                                          \
  do {                                                                                   \
    if (!(cond)) {                                                                       \
      std::fprintf(stderr, "invariant failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                      \
    }                                                                                    \
  } while (0)
