// kolo::trace: the timeline's recorder. Every thread records spans (a name, a category, a
// begin and an end on the monotonic clock, and a few numbers: bytes, sequence number, index,
// peer, algorithm) into a buffer of its own, allocated once when the thread first records;
// recording takes no lock and allocates nothing. It lives in the base layer so that comm, nn,
// data and parallel all record into it; the observe layer merges the ranks' files into one
// Chrome trace (kolo/timeline.h).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kolo::trace {

/// Nanoseconds on the monotonic clock (std::chrono::steady_clock, CLOCK_MONOTONIC).
int64_t nowNs();

/// One recorded span. `name`, `category` and `detail` must point to storage that outlives
/// the recorder (string literals, or intern()). `end == begin` with `instant` set is an
/// instant event (Chrome "ph":"i"); a negative number field is absent. A span with an
/// `asyncId` (from nextAsyncId()) is an asynchronous one: an operation that began on this
/// thread and whose end was seen later, perhaps after spans it does not enclose (a
/// non-blocking send); it is written as a Chrome async pair ("ph":"b" and "e") and drawn on
/// a track of its own instead of the thread's stack.
struct Span {
  const char* name = nullptr;
  const char* category = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t bytes = -1;
  int64_t seq = -1;
  int64_t index = -1;
  const char* detail = nullptr;  // the algorithm of a collective, or other short text
  int32_t peer = -1;
  bool instant = false;
  int64_t asyncId = -1;
};

/// What start() is told.
struct Options {
  /// Directory that writeRankFile() writes into (created when missing); may be empty for a
  /// recorder read only in memory (snapshot()).
  std::string directory;
  /// Spans each thread keeps; later ones are counted as dropped.
  size_t spansPerThread = 1 << 17;
  /// Write this rank's file at process exit (KOLO_TIMELINE for programs that do not call
  /// writeRankFile() themselves).
  bool writeAtExit = false;
};

namespace detail {
extern std::atomic<bool> gEnabled;  // read on every Scope (a relaxed load)
}

/// Whether spans are being recorded (cheap: one relaxed load).
inline bool enabled() { return detail::gEnabled.load(std::memory_order_relaxed); }

/// Starts recording in this process. Call before the threads that record start (or while
/// they are idle); a second start() begins a new recording (the old spans are not shown).
void start(const Options& options);
/// Stops recording; what was recorded stays readable.
void stop();
/// The directory of the recording ("" when none was started).
std::string directory();

/// Rank and world size written into the trace (set when the process joins a job).
void setRank(int rank, int worldSize);
int rank();
/// Offset to add to this process's clock to get rank 0's, and the round trip of the best
/// exchange it was measured with (NTP-style, comm's alignClocks()).
void setClockOffset(int64_t offsetNs, int64_t roundTripNs);
int64_t clockOffsetNs();
int64_t clockRoundTripNs();

/// Names this thread in the trace ("data loader", "comm progress"). Takes a copy.
void setThreadName(const std::string& name);

/// Records a finished span into this thread's buffer (nothing when not enabled).
void record(const Span& span);

/// An instant event now.
void instant(const char* name, const char* category, int64_t index = -1, int64_t bytes = -1);

/// A new identifier for an asynchronous span (unique in this process).
int64_t nextAsyncId();

/// A string of storage that lives as long as the process, one per distinct text (takes a
/// lock: call it once per name, not per event).
const char* intern(const std::string& text);

/// Records a span from construction to destruction on this thread when enabled.
class Scope {
 public:
  Scope(const char* name, const char* category) {
    if (enabled()) {
      span_.name = name;
      span_.category = category;
      span_.begin = nowNs();
      active_ = true;
    }
  }
  ~Scope() {
    if (active_) {
      span_.end = nowNs();
      record(span_);
    }
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;
  Scope& bytes(int64_t value) { span_.bytes = value; return *this; }
  Scope& seq(int64_t value) { span_.seq = value; return *this; }
  Scope& index(int64_t value) { span_.index = value; return *this; }
  Scope& peer(int32_t value) { span_.peer = value; return *this; }
  Scope& detail(const char* value) { span_.detail = value; return *this; }

 private:
  Span span_;
  bool active_ = false;
};

/// One thread's spans as recorded so far (in the order they ended).
struct ThreadSpans {
  int tid = 0;  // the OS thread id
  std::string name;
  std::vector<Span> spans;
  uint64_t dropped = 0;
};

/// Copies every thread's spans of the current recording. Safe while threads record (a span
/// being written is not yet visible).
std::vector<ThreadSpans> snapshot();

/// The recording as Chrome trace events of this process (pid = rank, tid = thread id,
/// timestamps in microseconds on rank 0's clock): a JSON object {"traceEvents": [...],
/// "kolo": {rank, world_size, clock_offset_ns, clock_rtt_ns, dropped}}.
std::string rankJson();

/// Writes rankJson() to DIRECTORY/trace.rank<R>.json (through a temporary file and rename)
/// and returns the path; throws IoError naming the file when it cannot. Nothing ("") when
/// no directory was given.
std::string writeRankFile();

}  // namespace kolo::trace
