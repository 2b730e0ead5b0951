// Unnamed shared-memory files (see shm_file.h).
#include "comm/shm_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>

#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

size_t mappedBytes(size_t bytes) { return bytes == 0 ? 1 : bytes; }

// MemAvailable from /proc/meminfo, in bytes.
size_t memAvailable() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  size_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return kUnlimited;
}

size_t readLimit(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return kUnlimited;
  try {
    return static_cast<size_t>(std::stoull(text));
  } catch (const std::exception&) {
    return kUnlimited;
  }
}

// What this process's cgroup (v2) may still charge: memory.max - memory.current.
size_t cgroupHeadroom() {
  std::ifstream in("/proc/self/cgroup");
  std::string line, dir = "/sys/fs/cgroup";
  while (std::getline(in, line))
    if (line.rfind("0::", 0) == 0) dir += line.substr(3);
  for (const std::string& d : {dir, std::string("/sys/fs/cgroup")}) {
    const size_t max = readLimit(d + "/memory.max");
    if (max == kUnlimited) continue;
    const size_t current = readLimit(d + "/memory.current");
    return current == kUnlimited || current >= max ? 0 : max - current;
  }
  return kUnlimited;
}

std::string mib(size_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return text;
}

}  // namespace

std::string machineHostId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string bootId;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> bootId;
  struct stat st {};
  unsigned long long netns = 0;
  if (stat("/proc/self/ns/net", &st) == 0) netns = static_cast<unsigned long long>(st.st_ino);
  return std::string(host) + "/" + bootId + "/" + std::to_string(netns);
}

size_t shmBytesAvailable(std::string* where) {
  size_t best = kUnlimited;
  std::string source = "memory";
  struct statvfs fs {};
  if (statvfs("/dev/shm", &fs) == 0) {
    best = static_cast<size_t>(fs.f_bavail) * fs.f_bsize;
    source = "/dev/shm";
  }
  const size_t memory = std::min(memAvailable(), cgroupHeadroom());
  if (memory < best) {
    best = memory;
    source = "memory";
  }
  if (where != nullptr) *where = source;
  return best;
}

ShmFile ShmFile::create(const std::string& label, size_t bytes) {
  // Refuse before reserving anything: a tmpfs reservation larger than free memory would
  // be filled page by page until the OOM killer stepped in.
  std::string where;
  const size_t available = shmBytesAvailable(&where);
  if (mappedBytes(bytes) > available)
    KOLO_THROW(IoError, "shared memory for ", label, ": ", mib(mappedBytes(bytes)), " needed, ", mib(available),
               " available in ", where);
  int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) fd = memfd_create(label.c_str(), MFD_CLOEXEC);
  if (fd < 0) KOLO_THROW(IoError, "shared memory for ", label, ": cannot create a file: ", std::strerror(errno));
  int rc = ftruncate(fd, static_cast<off_t>(mappedBytes(bytes))) == 0 ? 0 : errno;
  if (rc == 0) rc = posix_fallocate(fd, 0, static_cast<off_t>(mappedBytes(bytes)));
  void* base = MAP_FAILED;
  if (rc == 0) {
    base = mmap(nullptr, mappedBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) rc = errno;
  }
  if (rc != 0) {
    close(fd);
    KOLO_THROW(IoError, "shared memory for ", label, ": cannot reserve ", mib(mappedBytes(bytes)), " (",
               mib(shmBytesAvailable(&where)), " available in ", where, "): ", std::strerror(rc));
  }
  ShmFile file;
  file.base_ = base;
  file.bytes_ = bytes;
  file.fd_ = fd;
  return file;
}

ShmFile ShmFile::openPeer(int pid, int fd, size_t bytes) {
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  const int own = open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (own < 0)
    KOLO_THROW(IoError, "cannot open the shared memory of process ", pid, " (", path, "): ", std::strerror(errno),
               errno == ENOENT ? " (the process has exited)" : "");
  struct stat st {};
  if (fstat(own, &st) != 0 || (bytes != 0 && static_cast<size_t>(st.st_size) != mappedBytes(bytes)) ||
      st.st_size <= 0) {
    close(own);
    KOLO_THROW(IoError, "shared memory of process ", pid, " (", path, ") has ", st.st_size, " bytes, expected ",
               mappedBytes(bytes));
  }
  const size_t size = bytes != 0 ? bytes : static_cast<size_t>(st.st_size);
  void* base = mmap(nullptr, mappedBytes(size), PROT_READ | PROT_WRITE, MAP_SHARED, own, 0);
  const int e = errno;
  close(own);
  if (base == MAP_FAILED)
    KOLO_THROW(IoError, "cannot map the shared memory of process ", pid, ": ", std::strerror(e));
  ShmFile file;
  file.base_ = base;
  file.bytes_ = size;
  return file;
}

ShmFile::ShmFile(ShmFile&& other) noexcept { *this = std::move(other); }

ShmFile& ShmFile::operator=(ShmFile&& other) noexcept {
  if (this != &other) {
    release();
    base_ = std::exchange(other.base_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

ShmFile::~ShmFile() { release(); }

void ShmFile::release() {
  if (base_ != nullptr) munmap(base_, mappedBytes(bytes_));
  base_ = nullptr;
  closeFd();
}

void ShmFile::closeFd() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

}  // namespace kolo::comm::detail
