// kolo::observe hang diagnosis: reads the flight-recorder dumps of a job
// (DIR/flight.rank<R>.json, kolo/flight_recorder.h) and says in plain words who waits for
// whom: which ranks are in which collective at which sequence number, which rank never
// entered it and what it did instead, or which signatures disagree. `kolo report hang DIR`
// prints it, and `kolo run` prints it when it stops a stalled or failed job.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kolo::observe {

/// One collective (or send/recv) of a dump.
struct FlightEntry {
  uint64_t id = 0;
  int64_t seq = -1;
  uint32_t context = 0;
  int groupRank = 0;
  int groupSize = 1;
  std::string op, dtype, reduce, algorithm, state, error;
  int64_t count = 0;
  int64_t bytes = 0;
  int root = -1;
  int peer = -1;
  int64_t queuedNs = 0, startedNs = 0, finishedNs = 0;
  /// "allreduce f32 sum count=1000" (plus root and a forced algorithm): what ranks compare.
  std::string signature() const;
};

/// One thread's stack in a dump, innermost frame first ("function (module)").
struct DumpedStack {
  int tid = 0;
  std::string name;
  bool answered = false;
  std::vector<std::string> frames;
};

/// One rank's dump.
struct FlightDump {
  std::string path;
  int rank = 0;
  int worldSize = 1;
  int64_t pid = 0;
  std::string reason;  // "timeout", "mismatch", "SIGUSR1", "stalled"...
  std::string note;    // what the launcher saw of the process, when it wrote the dump
  int64_t dumpNs = 0;
  std::vector<FlightEntry> entries;  // oldest first
  std::vector<DumpedStack> stacks;   // every thread's, when the rank wrote the dump itself
};

/// "sleep < main < __libc_start_call_main": the first `frames` frames of a stack, innermost
/// first, each without its argument list, symbol version and module.
std::string shortStack(const DumpedStack& stack, size_t frames = 6);

/// Reads every DIR/flight.rank<R>.json, sorted by rank. Throws FileError when DIR has none,
/// FormatError naming a file that is not a dump.
std::vector<FlightDump> loadFlightDumps(const std::string& dir);

/// The diagnosis as lines of plain text (no trailing newlines). The last lines start with
/// "=> " and give the verdict: the missing rank(s), a stopped rank, or the mismatching pair.
/// `worldSize` 0: the largest world size the dumps name.
std::vector<std::string> diagnoseHang(const std::vector<FlightDump>& dumps, int worldSize = 0);

}  // namespace kolo::observe
