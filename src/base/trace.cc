// The timeline recorder: one span buffer per thread, allocated when the thread first records
// and kept for the life of the process (a thread that ended still shows in the trace), and
// this process's Chrome trace events written by hand (the base layer has no JSON library).
#include "kolo/trace.h"

#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>

#include "base/json_text.h"
#include "kolo/error.h"

namespace kolo::trace {
namespace detail {
std::atomic<bool> gEnabled{false};
}

namespace {

struct ThreadBuffer {
  explicit ThreadBuffer(size_t capacity, uint64_t generation)
      : spans(new Span[capacity]), capacity(capacity), generation(generation) {}
  std::unique_ptr<Span[]> spans;
  size_t capacity;
  uint64_t generation;
  std::atomic<size_t> count{0};  // spans[0, count) are complete (release/acquire)
  std::atomic<uint64_t> dropped{0};
  int tid = 0;
  std::mutex nameMutex;
  std::string name;
};

// The process's recorder: the buffers of every thread, each recording's options and the
// clock alignment. One per process, because spans come from every layer and thread without
// a handle passed down; it is reached only through the functions of kolo/trace.h.
struct Recorder {
  std::mutex mutex;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;  // never freed: threads keep pointers
  Options options;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> rank{0};
  std::atomic<int> worldSize{1};
  std::atomic<int64_t> offsetNs{0};
  std::atomic<int64_t> roundTripNs{-1};
  bool atExitRegistered = false;
  std::set<std::string> interned;
};

Recorder& recorder() {
  static Recorder* instance = new Recorder();  // outlives every thread, even at exit
  return *instance;
}

thread_local ThreadBuffer* tBuffer = nullptr;
thread_local std::string tName;

ThreadBuffer* threadBuffer() {
  Recorder& r = recorder();
  const uint64_t generation = r.generation.load(std::memory_order_acquire);
  if (tBuffer != nullptr && tBuffer->generation == generation) return tBuffer;
  std::lock_guard<std::mutex> lock(r.mutex);
  auto buffer = std::make_unique<ThreadBuffer>(r.options.spansPerThread, generation);
  buffer->tid = static_cast<int>(::syscall(SYS_gettid));
  buffer->name = tName;
  tBuffer = buffer.get();
  r.buffers.push_back(std::move(buffer));
  return tBuffer;
}

void appendEscaped(std::string& out, const char* text) { kolo::detail::appendJsonEscaped(out, text); }

void appendMicros(std::string& out, int64_t ns) {
  char text[40];
  std::snprintf(text, sizeof text, "%.3f", static_cast<double>(ns) / 1000.0);
  out += text;
}

void writeAtExit() {
  try {
    stop();
    writeRankFile();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo: timeline not written: %s\n", e.what());
  }
}

void makeDirectories(const std::string& path) {
  std::string partial;
  size_t at = 0;
  while (at != std::string::npos) {
    at = path.find('/', at + 1);
    partial = path.substr(0, at);
    if (partial.empty()) continue;
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST)
      KOLO_THROW(IoError, "cannot create the directory ", partial, ": ", std::strerror(errno));
  }
}

}  // namespace

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void start(const Options& options) {
  KOLO_REQUIRE(options.spansPerThread > 0, "timeline: spans per thread must be at least 1");
  Recorder& r = recorder();
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    r.options = options;
    if (!options.directory.empty()) makeDirectories(options.directory);
    if (options.writeAtExit && !r.atExitRegistered) {
      r.atExitRegistered = true;
      std::atexit(writeAtExit);
    }
  }
  r.generation.fetch_add(1, std::memory_order_acq_rel);
  detail::gEnabled.store(true, std::memory_order_release);
}

void stop() { detail::gEnabled.store(false, std::memory_order_release); }

std::string directory() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.options.directory;
}

void setRank(int rank, int worldSize) {
  recorder().rank.store(rank);
  recorder().worldSize.store(worldSize);
}
int rank() { return recorder().rank.load(); }

void setClockOffset(int64_t offsetNs, int64_t roundTripNs) {
  recorder().offsetNs.store(offsetNs);
  recorder().roundTripNs.store(roundTripNs);
}
int64_t clockOffsetNs() { return recorder().offsetNs.load(); }
int64_t clockRoundTripNs() { return recorder().roundTripNs.load(); }

void setThreadName(const std::string& name) {
  tName = name;
  if (tBuffer != nullptr) {
    std::lock_guard<std::mutex> lock(tBuffer->nameMutex);
    tBuffer->name = name;
  }
}

void record(const Span& span) {
  if (!enabled()) return;
  ThreadBuffer* buffer = threadBuffer();
  // Only this thread writes its buffer; readers see spans below `count` (release below).
  const size_t at = buffer->count.load(std::memory_order_relaxed);
  if (at >= buffer->capacity) {
    buffer->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  buffer->spans[at] = span;
  buffer->count.store(at + 1, std::memory_order_release);
}

void instant(const char* name, const char* category, int64_t index, int64_t bytes) {
  if (!enabled()) return;
  Span span;
  span.name = name;
  span.category = category;
  span.begin = span.end = nowNs();
  span.index = index;
  span.bytes = bytes;
  span.instant = true;
  record(span);
}

const char* intern(const std::string& text) {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.interned.insert(text).first->c_str();  // set nodes never move
}

std::vector<ThreadSpans> snapshot() {
  Recorder& r = recorder();
  std::lock_guard<std::mutex> lock(r.mutex);
  const uint64_t generation = r.generation.load(std::memory_order_acquire);
  std::vector<ThreadSpans> out;
  for (const auto& buffer : r.buffers) {
    if (buffer->generation != generation) continue;
    ThreadSpans thread;
    thread.tid = buffer->tid;
    {
      std::lock_guard<std::mutex> nameLock(buffer->nameMutex);
      thread.name = buffer->name;
    }
    const size_t count = buffer->count.load(std::memory_order_acquire);
    thread.spans.assign(buffer->spans.get(), buffer->spans.get() + count);
    thread.dropped = buffer->dropped.load(std::memory_order_relaxed);
    out.push_back(std::move(thread));
  }
  return out;
}

std::string rankJson() {
  const std::vector<ThreadSpans> threads = snapshot();
  const int pid = rank();
  const int64_t offset = clockOffsetNs();
  uint64_t dropped = 0;
  std::string out = "{\"traceEvents\":[\n";
  bool first = true;
  auto open = [&] {
    if (!first) out += ",\n";
    first = false;
  };
  const std::string pidText = std::to_string(pid);
  open();
  out += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pidText +
         ",\"tid\":0,\"args\":{\"name\":\"rank " + pidText + "\"}}";
  open();
  out += "{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + pidText +
         ",\"tid\":0,\"args\":{\"sort_index\":" + pidText + "}}";
  for (const ThreadSpans& thread : threads) {
    dropped += thread.dropped;
    const std::string tid = std::to_string(thread.tid);
    open();
    out += "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + pidText + ",\"tid\":" + tid +
           ",\"args\":{\"name\":\"";
    appendEscaped(out, thread.name.empty() ? ("thread " + tid).c_str() : thread.name.c_str());
    out += "\"}}";
    std::vector<Span> spans = thread.spans;
    // Parents before their children: by begin, the longer first.
    std::stable_sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end > b.end;
    });
    for (const Span& s : spans) {
      open();
      out += s.instant ? "{\"ph\":\"i\",\"s\":\"t\",\"name\":\"" : "{\"ph\":\"X\",\"name\":\"";
      appendEscaped(out, s.name ? s.name : "?");
      out += "\",\"cat\":\"";
      appendEscaped(out, s.category ? s.category : "kolo");
      out += "\",\"ts\":";
      appendMicros(out, s.begin + offset);
      if (!s.instant) {
        out += ",\"dur\":";
        appendMicros(out, s.end - s.begin);
      }
      out += ",\"pid\":" + pidText + ",\"tid\":" + tid + ",\"args\":{";
      bool firstArg = true;
      auto arg = [&](const char* key, int64_t value) {
        if (value < 0) return;
        out += firstArg ? "\"" : ",\"";
        firstArg = false;
        out += key;
        out += "\":" + std::to_string(value);
      };
      arg("bytes", s.bytes);
      arg("seq", s.seq);
      arg("index", s.index);
      arg("peer", s.peer);
      if (s.detail) {
        out += firstArg ? "\"" : ",\"";
        firstArg = false;
        out += "detail\":\"";
        appendEscaped(out, s.detail);
        out += "\"";
      }
      out += "}}";
    }
  }
  out += "\n],\"displayTimeUnit\":\"ms\",\"kolo\":{\"rank\":" + pidText +
         ",\"world_size\":" + std::to_string(recorder().worldSize.load()) +
         ",\"clock_offset_ns\":" + std::to_string(offset) +
         ",\"clock_rtt_ns\":" + std::to_string(clockRoundTripNs()) +
         ",\"dropped\":" + std::to_string(dropped) + "}}\n";
  return out;
}

std::string writeRankFile() {
  const std::string dir = directory();
  if (dir.empty()) return "";
  makeDirectories(dir);
  const std::string path = dir + "/trace.rank" + std::to_string(rank()) + ".json";
  const std::string temporary = path + ".tmp";
  const std::string text = rankJson();
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) KOLO_THROW(IoError, "cannot write the timeline ", temporary, ": ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !ok || std::rename(temporary.c_str(), path.c_str()) != 0)
    KOLO_THROW(IoError, "cannot write the timeline ", path, ": ", std::strerror(errno));
  return path;
}

}  // namespace kolo::trace
