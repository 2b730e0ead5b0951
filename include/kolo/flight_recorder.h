// kolo::flight: the flight recorder. Every process keeps its last K collectives in a ring
// (sequence number, operation, dtype, count, algorithm, peers, state queued/started/done or
// failed, timestamps), always on. When KOLO_DEBUG_DIR is set the ring lives in a file there
// (DIR/flight.rank<R>.ring, mapped shared), so `kolo run` can read the ring of a rank that no
// longer answers (stopped, or killed) as well as watch every rank's progress. A rank writes
// its ring as JSON (DIR/flight.rank<R>.json) on a Timeout or Mismatch of a collective and on
// SIGUSR1; `kolo report hang DIR` reads those files (kolo/hang_report.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace kolo::flight {

/// A collective's state in the ring.
enum class State : uint8_t { Empty = 0, Queued = 1, Started = 2, Done = 3, Failed = 4 };
const char* stateName(State state);

/// What a collective is, as the comm layer describes it when it is issued. Text fields are
/// copied (and cut to their field's size).
struct Description {
  int64_t seq = -1;          // the communicator's sequence number (-1: point to point)
  uint32_t context = 0;      // the communicator's id (1: the world); equal on every member
  int32_t groupRank = 0;     // this rank in that communicator
  int32_t groupSize = 1;
  const char* op = "";       // "allreduce", "send", ...
  const char* dtype = "";    // "f32"
  const char* reduce = "";   // "sum" (reductions only)
  const char* algorithm = "";  // what was requested ("auto", "ring"...)
  int64_t count = 0;
  int64_t bytes = 0;
  int32_t root = -1;
  int32_t peer = -1;  // point to point: the other rank
};

// ---- the ring's layout (shared between a rank and `kolo run`, which reads it) ----

inline constexpr char kRingMagic[8] = {'K', 'O', 'L', 'O', 'F', 'R', '1', '\0'};

struct RingHeader {
  char magic[8];
  uint32_t capacity;  // entries after the header
  uint32_t entryBytes;
  int32_t rank;
  int32_t worldSize;
  int64_t pid;
  std::atomic<uint64_t> next;      // entries ever begun (the next ordinal)
  std::atomic<uint64_t> progress;  // bumped at every state change
  std::atomic<int64_t> lastChangeNs;
};

struct RingEntry {
  std::atomic<uint64_t> ordinal;  // ordinal + 1 of the record held, 0 while being written
  std::atomic<uint8_t> state;
  char op[16];
  char dtype[8];
  char reduce[8];
  char algorithm[24];
  int64_t seq;
  uint32_t context;
  int32_t groupRank;
  int32_t groupSize;
  int32_t root;
  int32_t peer;
  int64_t count;
  int64_t bytes;
  std::atomic<int64_t> queuedNs;
  std::atomic<int64_t> startedNs;
  std::atomic<int64_t> finishedNs;
  char error[160];  // a failure's message, cut
};

// ---- recording (called by the comm layer) ----

/// Sets this process's rank and world size and places the ring: a shared file under
/// KOLO_DEBUG_DIR when set, else memory. KOLO_FLIGHT_RECORDER entries (0: off). The first
/// call wins; later calls (sub-communicators, threads as ranks) change nothing. Installs the
/// SIGUSR1 handler that dumps the ring. Throws IoError when the file cannot be made.
void attach(int rank, int worldSize);

/// Whether the recorder is on (attach() ran and K > 0).
bool enabled();

/// Records a collective as queued now (and started, with `startNow`: a blocking call that
/// runs at once); returns its ordinal (for the calls below), or 0 when the recorder is off.
uint64_t begin(const Description& description, bool startNow = false);
/// Marks ordinal `id` started, done, or failed with `error` (a message, cut to fit). Nothing
/// when the entry was overwritten since (the ring wrapped) or id is 0.
void started(uint64_t id);
void finished(uint64_t id);
void failed(uint64_t id, const char* error);

// ---- dumping ----

/// Writes the ring as JSON into KOLO_DEBUG_DIR/flight.rank<R>.json (through a temporary
/// file) with `reason` ("timeout", "mismatch", "SIGUSR1"...) and the stack of every thread of
/// the process (each asked through a signal, at most 100 ms each; a thread that does not
/// answer is listed without frames), and returns the path, or "" when no debug directory is
/// set or the recorder is off. Never throws (a dump runs on error paths).
std::string dump(const std::string& reason);

/// JSON of a ring (the format of dump()), for `kolo run`, which reads the ring files of its
/// ranks. `note` is added as "note" (for instance, what the launcher saw of the process);
/// `stacks`, when not empty, as "stacks" (a JSON array: each thread's id, name and frames,
/// innermost first).
std::string ringJson(const RingHeader& header, const RingEntry* entries, const std::string& reason,
                     const std::string& note, const std::string& stacks = "");

/// Reads the ring file `ringPath` (written by attach()) and writes its JSON to `jsonPath`
/// with `reason` and `note`. Throws IoError or FormatError naming the file.
void convertRingFile(const std::string& ringPath, const std::string& jsonPath,
                     const std::string& reason, const std::string& note);

/// The `progress` counter of the ring file `ringPath`; -1 when it does not exist (yet) or is
/// not a ring.
int64_t ringProgress(const std::string& ringPath);

/// DIR/flight.rank<R>.ring and DIR/flight.rank<R>.json.
std::string ringPath(const std::string& dir, int rank);
std::string dumpPath(const std::string& dir, int rank);

}  // namespace kolo::flight
