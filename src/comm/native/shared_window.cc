// POSIX shared-memory parts of a NativeSharedWindow (see shared_window.h).
#include "comm/native/shared_window.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::comm::native {

NativeSharedWindow::NativeSharedWindow(size_t bytes, int rank, std::vector<void*> parts)
    : bytes_(bytes), rank_(rank), parts_(std::move(parts)) {}

NativeSharedWindow::~NativeSharedWindow() {
  for (void* p : parts_) unmapSharedPart(p, bytes_);
}

void* NativeSharedWindow::part(int rank) {
  KOLO_CHECK(rank >= 0 && static_cast<size_t>(rank) < parts_.size(), "shared window: rank ", rank,
             " is not in the group of ", parts_.size());
  return parts_[static_cast<size_t>(rank)];
}

namespace {

// A zero-byte window still gets a page, so that every part has a distinct address.
size_t mappedBytes(size_t bytes) { return bytes == 0 ? 1 : bytes; }

}  // namespace

void* createSharedPart(const std::string& name, size_t bytes, std::string& error) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open(" + name + "): " + std::strerror(errno);
    return nullptr;
  }
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(mappedBytes(bytes))) != 0) {
    error = "ftruncate(" + name + ", " + std::to_string(bytes) + "): " + std::strerror(errno);
  } else {
    base = mmap(nullptr, mappedBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) error = "mmap(" + name + "): " + std::strerror(errno);
  }
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return nullptr;
  }
  return base;
}

void* openSharedPart(const std::string& name, size_t bytes, std::string& error) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) {
    error = "shm_open(" + name + "): " + std::strerror(errno);
    return nullptr;
  }
  struct stat st {};
  void* base = MAP_FAILED;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != mappedBytes(bytes)) {
    error = "shared window part " + name + " has " + std::to_string(st.st_size) +
            " bytes, expected " + std::to_string(mappedBytes(bytes));
  } else {
    base = mmap(nullptr, mappedBytes(bytes), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) error = "mmap(" + name + "): " + std::strerror(errno);
  }
  close(fd);
  return base == MAP_FAILED ? nullptr : base;
}

void unmapSharedPart(void* part, size_t bytes) {
  if (part != nullptr) munmap(part, mappedBytes(bytes));
}

}  // namespace kolo::comm::native
