// POSIX shared-memory SharedWindow (see shared_window.h).
#include "comm/shared_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

// A zero-byte window still gets a page, so that every part has a distinct address.
size_t mappedBytes(size_t bytes) { return bytes == 0 ? 1 : bytes; }

void unmapPart(void* part, size_t bytes) {
  if (part != nullptr) munmap(part, mappedBytes(bytes));
}

// Mappings of every rank's part; unmapped by the destructor.
class PosixSharedWindow : public SharedWindow {
 public:
  PosixSharedWindow(size_t bytes, int rank, std::vector<void*> parts)
      : bytes_(bytes), rank_(rank), parts_(std::move(parts)) {}
  ~PosixSharedWindow() override {
    for (void* p : parts_) unmapPart(p, bytes_);
  }
  PosixSharedWindow(const PosixSharedWindow&) = delete;
  PosixSharedWindow& operator=(const PosixSharedWindow&) = delete;

  size_t bytes() const override { return bytes_; }
  void* local() override { return parts_[static_cast<size_t>(rank_)]; }
  void* part(int rank) override {
    KOLO_CHECK(rank >= 0 && static_cast<size_t>(rank) < parts_.size(), "shared window: rank ",
               rank, " is not in the group of ", parts_.size());
    return parts_[static_cast<size_t>(rank)];
  }

 private:
  size_t bytes_;
  int rank_;
  std::vector<void*> parts_;
};

// Creates (O_EXCL), reserves and maps a zero-filled object `name` of `bytes`; nullptr on
// failure (the object is then removed).
void* createPart(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  // Reserve the pages now: a /dev/shm too small for the window then fails here, instead
  // of a later store into an unbacked page ending the process with SIGBUS.
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(mappedBytes(bytes))) == 0 &&
      posix_fallocate(fd, 0, static_cast<off_t>(mappedBytes(bytes))) == 0)
    base = mmap(nullptr, mappedBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  return base;
}

// Maps the existing object `name` of exactly `bytes`; nullptr on failure.
void* openPart(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == mappedBytes(bytes))
    base = mmap(nullptr, mappedBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  return base == MAP_FAILED ? nullptr : base;
}

}  // namespace

std::shared_ptr<SharedWindow> allocatePosixSharedWindow(Communicator& comm, size_t bytes,
                                                        uint64_t tag) {
  const int n = comm.size();
  const int me = comm.rank();
  constexpr size_t kRecord = 64;  // per rank: ok flag, then the object's name
  char name[kRecord - 1] = {};
  // Thread ranks share a pid: the rank and the caller's tag tell them apart.
  std::snprintf(name, sizeof(name), "/kolo-win-%d-%d-%llx", static_cast<int>(getpid()), me,
                static_cast<unsigned long long>(tag));
  void* own = createPart(name, bytes);
  char mine[kRecord] = {};
  mine[0] = own != nullptr ? 1 : 0;
  std::memcpy(mine + 1, name, sizeof(name));
  std::vector<char> records(kRecord * static_cast<size_t>(n));
  std::vector<void*> parts(static_cast<size_t>(n), nullptr);
  parts[static_cast<size_t>(me)] = own;
  bool linked = own != nullptr;
  auto release = [&] {
    for (void* p : parts) unmapPart(p, bytes);
    if (linked) shm_unlink(name);
  };
  try {
    comm.allgather(mine, records.data(), kRecord, DType::U8);
    int32_t ok = 1;
    for (int r = 0; r < n; ++r) ok &= records[kRecord * static_cast<size_t>(r)];
    for (int r = 0; ok && r < n; ++r) {
      if (r == me) continue;
      void* part = openPart(&records[kRecord * static_cast<size_t>(r) + 1], bytes);
      parts[static_cast<size_t>(r)] = part;
      if (part == nullptr) ok = 0;
    }
    // Every rank has mapped every part (or one failed) before any name goes away.
    int32_t all = ok;
    comm.allreduce(&ok, &all, 1, DType::I32, ReduceOp::Min);
    if (linked) shm_unlink(name);
    linked = false;
    if (!all) {
      release();
      return nullptr;
    }
  } catch (...) {
    release();
    throw;
  }
  return std::make_shared<PosixSharedWindow>(bytes, me, std::move(parts));
}

}  // namespace kolo::comm::detail
