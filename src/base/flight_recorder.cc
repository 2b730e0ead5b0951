// The flight recorder's ring (in a shared file under KOLO_DEBUG_DIR, or in memory), its
// JSON dump, and the SIGUSR1 handler: the handler only writes a byte to a pipe, and a thread
// of the recorder's own reads it and dumps (formatting and writing files is not
// async-signal-safe).
#include "kolo/flight_recorder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "base/json_text.h"
#include "kolo/error.h"
#include "kolo/settings.h"

namespace kolo::flight {
namespace {

int64_t nowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The process's ring. One per process, like the collectives it describes come from every
// communicator of the process; reached only through the functions of flight_recorder.h.
struct Ring {
  std::mutex mutex;  // attach and dump only
  std::atomic<bool> attached{false};
  RingHeader* header = nullptr;
  RingEntry* entries = nullptr;
  uint32_t capacity = 0;
  std::string dir;
  int signalPipe[2] = {-1, -1};
  pid_t handlerPid = 0;  // the process the SIGUSR1 thread runs in (fork leaves it behind)
};

Ring& ring() {
  static Ring* instance = new Ring();  // outlives every thread, even at exit
  return *instance;
}

void copyText(char* to, size_t size, const char* from) {
  if (from == nullptr) from = "";
  const size_t n = std::min(size - 1, std::strlen(from));
  std::memcpy(to, from, n);
  to[n] = '\0';
}

RingEntry* entryOf(uint64_t id) {
  Ring& r = ring();
  if (id == 0 || !r.attached.load(std::memory_order_acquire) || r.capacity == 0) return nullptr;
  RingEntry& e = r.entries[(id - 1) % r.capacity];
  return e.ordinal.load(std::memory_order_acquire) == id ? &e : nullptr;
}

// Progress for the launcher's stall watch: any change of the counter counts, so two threads
// that bump it at once and lose one increment do no harm (a load and a store are cheaper
// than a locked add on every collective).
void touch(int64_t now) {
  RingHeader* h = ring().header;
  h->progress.store(h->progress.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  h->lastChangeNs.store(now, std::memory_order_relaxed);
}

void appendEscaped(std::string& out, const char* text, size_t limit) {
  out += '"';
  kolo::detail::appendJsonEscaped(out, text, limit);
  out += '"';
}

void appendString(std::string& out, const std::string& text) {
  appendEscaped(out, text.c_str(), text.size());
}

void writeFile(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) KOLO_THROW(IoError, "cannot write ", temporary, ": ", std::strerror(errno));
  const bool ok = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !ok || std::rename(temporary.c_str(), path.c_str()) != 0)
    KOLO_THROW(IoError, "cannot write ", path, ": ", std::strerror(errno));
}

void makeDirectories(const std::string& path) {
  for (size_t at = path.find('/', 1);; at = path.find('/', at + 1)) {
    const std::string partial = path.substr(0, at);
    if (::mkdir(partial.c_str(), 0777) != 0 && errno != EEXIST)
      KOLO_THROW(IoError, "cannot create the debug directory ", partial, ": ", std::strerror(errno));
    if (at == std::string::npos) break;
  }
}

void onSignal(int) {
  const int saved = errno;
  const char byte = 1;
  [[maybe_unused]] ssize_t n = ::write(ring().signalPipe[1], &byte, 1);
  errno = saved;
}

// Called with the ring's mutex held.
void installSignalHandler(Ring& r) {
  if (r.handlerPid == ::getpid()) return;
  if (r.signalPipe[0] >= 0) {  // inherited through fork: the reading thread stayed behind
    ::close(r.signalPipe[0]);
    ::close(r.signalPipe[1]);
  }
  if (::pipe2(r.signalPipe, O_CLOEXEC) != 0) return;
  ::fcntl(r.signalPipe[1], F_SETFL, O_NONBLOCK);
  r.handlerPid = ::getpid();
  const int readEnd = r.signalPipe[0];
  std::thread([readEnd] {
    char byte;
    for (;;) {
      const ssize_t n = ::read(readEnd, &byte, 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      const std::string path = dump("SIGUSR1");
      if (!path.empty())
        std::fprintf(stderr, "kolo: rank %d: SIGUSR1: flight recorder written to %s\n",
                     ring().header->rank, path.c_str());
    }
  }).detach();
  struct sigaction action {};
  action.sa_handler = onSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(SIGUSR1, &action, nullptr);
}

}  // namespace

const char* stateName(State state) {
  switch (state) {
    case State::Empty: return "empty";
    case State::Queued: return "queued";
    case State::Started: return "started";
    case State::Done: return "done";
    case State::Failed: return "failed";
  }
  return "unknown";
}

std::string ringPath(const std::string& dir, int rank) {
  return dir + "/flight.rank" + std::to_string(rank) + ".ring";
}
std::string dumpPath(const std::string& dir, int rank) {
  return dir + "/flight.rank" + std::to_string(rank) + ".json";
}

void attach(int rank, int worldSize) {
  Ring& r = ring();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.attached.load(std::memory_order_acquire)) {
    installSignalHandler(r);
    return;
  }
  const settings::Environment env = settings::Environment::process();
  const int64_t capacity = settings::flightRecorder(env).value_or(1024);
  KOLO_REQUIRE(capacity >= 0 && capacity <= (1 << 20), "KOLO_FLIGHT_RECORDER=", capacity,
               " is not accepted: give the number of collectives to keep, 0 to 1048576 (0: off)");
  if (capacity == 0) return;
  const size_t bytes = sizeof(RingHeader) + static_cast<size_t>(capacity) * sizeof(RingEntry);
  r.dir = settings::debugDir(env);
  void* memory = nullptr;
  if (!r.dir.empty()) {
    makeDirectories(r.dir);
    const std::string path = ringPath(r.dir, rank);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) KOLO_THROW(IoError, "flight recorder: cannot create ", path, ": ", std::strerror(errno));
    if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      const int error = errno;
      ::close(fd);
      KOLO_THROW(IoError, "flight recorder: cannot size ", path, ": ", std::strerror(error));
    }
    memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    if (memory == MAP_FAILED)
      KOLO_THROW(IoError, "flight recorder: cannot map ", path, ": ", std::strerror(errno));
  } else {
    memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED)
      KOLO_THROW(IoError, "flight recorder: cannot allocate ", bytes, " bytes: ", std::strerror(errno));
  }
  // The file is zero-filled: every entry starts empty (ordinal 0).
  auto* header = new (memory) RingHeader{};
  header->capacity = static_cast<uint32_t>(capacity);
  header->entryBytes = sizeof(RingEntry);
  header->rank = rank;
  header->worldSize = worldSize;
  header->pid = ::getpid();
  header->lastChangeNs.store(nowNs());
  r.entries = reinterpret_cast<RingEntry*>(static_cast<char*>(memory) + sizeof(RingHeader));
  for (int64_t i = 0; i < capacity; ++i) new (&r.entries[i]) RingEntry{};
  r.capacity = static_cast<uint32_t>(capacity);
  r.header = header;
  std::memcpy(header->magic, kRingMagic, sizeof kRingMagic);  // last: readers check it
  r.attached.store(true, std::memory_order_release);
  installSignalHandler(r);
}

bool enabled() { return ring().attached.load(std::memory_order_acquire); }

uint64_t begin(const Description& d, bool startNow) {
  Ring& r = ring();
  if (!r.attached.load(std::memory_order_acquire)) return 0;
  const uint64_t ordinal = r.header->next.fetch_add(1, std::memory_order_relaxed);
  RingEntry& e = r.entries[ordinal % r.capacity];
  // Readers take an entry only when its ordinal reads the same before and after copying it.
  e.ordinal.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.state.store(static_cast<uint8_t>(State::Queued), std::memory_order_relaxed);
  copyText(e.op, sizeof e.op, d.op);
  copyText(e.dtype, sizeof e.dtype, d.dtype);
  copyText(e.reduce, sizeof e.reduce, d.reduce);
  copyText(e.algorithm, sizeof e.algorithm, d.algorithm);
  e.seq = d.seq;
  e.context = d.context;
  e.groupRank = d.groupRank;
  e.groupSize = d.groupSize;
  e.root = d.root;
  e.peer = d.peer;
  e.count = d.count;
  e.bytes = d.bytes;
  const int64_t now = nowNs();
  e.queuedNs.store(now, std::memory_order_relaxed);
  e.startedNs.store(startNow ? now : 0, std::memory_order_relaxed);
  e.finishedNs.store(0, std::memory_order_relaxed);
  e.error[0] = '\0';
  if (startNow) e.state.store(static_cast<uint8_t>(State::Started), std::memory_order_relaxed);
  e.ordinal.store(ordinal + 1, std::memory_order_release);
  touch(now);
  return ordinal + 1;
}

void started(uint64_t id) {
  if (RingEntry* e = entryOf(id)) {
    const int64_t now = nowNs();
    e->startedNs.store(now, std::memory_order_relaxed);
    e->state.store(static_cast<uint8_t>(State::Started), std::memory_order_release);
    touch(now);
  }
}

void finished(uint64_t id) {
  if (RingEntry* e = entryOf(id)) {
    const int64_t now = nowNs();
    e->finishedNs.store(now, std::memory_order_relaxed);
    e->state.store(static_cast<uint8_t>(State::Done), std::memory_order_release);
    touch(now);
  }
}

void failed(uint64_t id, const char* error) {
  if (RingEntry* e = entryOf(id)) {
    copyText(e->error, sizeof e->error, error);
    const int64_t now = nowNs();
    e->finishedNs.store(now, std::memory_order_relaxed);
    e->state.store(static_cast<uint8_t>(State::Failed), std::memory_order_release);
    touch(now);
  }
}

std::string ringJson(const RingHeader& header, const RingEntry* entries, const std::string& reason,
                     const std::string& note) {
  std::string out = "{\"rank\":" + std::to_string(header.rank) +
                    ",\"world_size\":" + std::to_string(header.worldSize) +
                    ",\"pid\":" + std::to_string(header.pid) + ",\"reason\":";
  appendString(out, reason);
  out += ",\"note\":";
  appendString(out, note);
  const uint64_t next = header.next.load(std::memory_order_acquire);
  out += ",\"dump_ns\":" + std::to_string(nowNs()) +
         ",\"last_change_ns\":" + std::to_string(header.lastChangeNs.load()) +
         ",\"capacity\":" + std::to_string(header.capacity) +
         ",\"recorded\":" + std::to_string(next) + ",\"entries\":[";
  const uint64_t first = next > header.capacity ? next - header.capacity : 0;
  bool firstEntry = true;
  for (uint64_t o = first; o < next; ++o) {
    const RingEntry& e = entries[o % header.capacity];
    if (e.ordinal.load(std::memory_order_acquire) != o + 1) continue;  // being written
    RingEntry copy;
    std::memcpy(copy.op, e.op, sizeof copy.op);
    std::memcpy(copy.dtype, e.dtype, sizeof copy.dtype);
    std::memcpy(copy.reduce, e.reduce, sizeof copy.reduce);
    std::memcpy(copy.algorithm, e.algorithm, sizeof copy.algorithm);
    const State state = static_cast<State>(e.state.load(std::memory_order_acquire));
    std::memcpy(copy.error, e.error, sizeof copy.error);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.ordinal.load(std::memory_order_relaxed) != o + 1) continue;  // overwritten meanwhile
    out += firstEntry ? "\n" : ",\n";
    firstEntry = false;
    out += "{\"id\":" + std::to_string(o + 1) + ",\"seq\":" + std::to_string(e.seq) +
           ",\"context\":" + std::to_string(e.context) + ",\"group_rank\":" + std::to_string(e.groupRank) +
           ",\"group_size\":" + std::to_string(e.groupSize) + ",\"op\":";
    appendEscaped(out, copy.op, sizeof copy.op);
    out += ",\"dtype\":";
    appendEscaped(out, copy.dtype, sizeof copy.dtype);
    out += ",\"reduce\":";
    appendEscaped(out, copy.reduce, sizeof copy.reduce);
    out += ",\"algorithm\":";
    appendEscaped(out, copy.algorithm, sizeof copy.algorithm);
    out += ",\"count\":" + std::to_string(e.count) + ",\"bytes\":" + std::to_string(e.bytes) +
           ",\"root\":" + std::to_string(e.root) + ",\"peer\":" + std::to_string(e.peer) +
           ",\"state\":\"" + stateName(state) + "\"" +
           ",\"queued_ns\":" + std::to_string(e.queuedNs.load(std::memory_order_relaxed)) +
           ",\"started_ns\":" + std::to_string(e.startedNs.load(std::memory_order_relaxed)) +
           ",\"finished_ns\":" + std::to_string(e.finishedNs.load(std::memory_order_relaxed)) +
           ",\"error\":";
    appendEscaped(out, copy.error, sizeof copy.error);
    out += "}";
  }
  out += "\n]}\n";
  return out;
}

std::string dump(const std::string& reason) {
  Ring& r = ring();
  try {
    std::lock_guard<std::mutex> lock(r.mutex);
    if (!r.attached.load(std::memory_order_acquire) || r.dir.empty()) return "";
    const std::string path = dumpPath(r.dir, r.header->rank);
    writeFile(path, ringJson(*r.header, r.entries, reason, ""));
    return path;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo: flight recorder not written: %s\n", e.what());
    return "";
  }
}

namespace {

// A ring file mapped read-only; unmapped on destruction.
struct MappedRing {
  explicit MappedRing(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat info {};
    if (::fstat(fd, &info) == 0 && static_cast<size_t>(info.st_size) >= sizeof(RingHeader)) {
      bytes = static_cast<size_t>(info.st_size);
      void* memory = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
      if (memory != MAP_FAILED) base = memory;
    }
    ::close(fd);
  }
  ~MappedRing() {
    if (base) ::munmap(base, bytes);
  }
  const RingHeader* header() const {
    if (!base) return nullptr;
    const auto* h = static_cast<const RingHeader*>(base);
    if (std::memcmp(h->magic, kRingMagic, sizeof kRingMagic) != 0 || h->entryBytes != sizeof(RingEntry) ||
        sizeof(RingHeader) + static_cast<size_t>(h->capacity) * sizeof(RingEntry) > bytes || h->capacity == 0)
      return nullptr;
    return h;
  }
  void* base = nullptr;
  size_t bytes = 0;
};

}  // namespace

void convertRingFile(const std::string& ringFile, const std::string& jsonPath, const std::string& reason,
                     const std::string& note) {
  MappedRing mapped(ringFile);
  if (!mapped.base) KOLO_THROW(IoError, "cannot read the flight recorder ", ringFile, ": ", std::strerror(errno));
  const RingHeader* header = mapped.header();
  if (!header) KOLO_THROW(FormatError, ringFile, " is not a kolo flight recorder ring (bad header or size)");
  const auto* entries =
      reinterpret_cast<const RingEntry*>(static_cast<const char*>(mapped.base) + sizeof(RingHeader));
  writeFile(jsonPath, ringJson(*header, entries, reason, note));
}

int64_t ringProgress(const std::string& ringFile) {
  MappedRing mapped(ringFile);
  const RingHeader* header = mapped.header();
  return header ? static_cast<int64_t>(header->progress.load(std::memory_order_relaxed)) : -1;
}

}  // namespace kolo::flight
