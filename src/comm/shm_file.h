// Shared memory without names: an unnamed file on /dev/shm (O_TMPFILE, or a memfd where
// /dev/shm cannot hold one), reserved up front and mapped; other local processes open it
// through /proc/<pid>/fd/<fd> of its creator. Nothing ever appears under /dev/shm, so no
// kill of any process at any moment can leave a segment behind: the memory goes when the
// last process holding it exits.
#pragma once

#include <cstddef>
#include <string>

namespace kolo::comm::detail {

/// A mapped shared-memory file. Move-only; unmaps and closes on destruction.
class ShmFile {
 public:
  /// Creates an unnamed file of `bytes` (rounded up to one page when 0), reserves every page
  /// (a full /dev/shm or memory limit fails here, not with SIGBUS later) and maps it.
  /// `label` names it in /proc/<pid>/maps ("memfd:<label>" or "/dev/shm/#<inode>").
  /// Throws IoError naming the bytes wanted, the bytes available and where.
  static ShmFile create(const std::string& label, size_t bytes);
  /// Maps the file that process `pid` holds open as descriptor `fd`, which must have
  /// exactly `bytes` (0: any size, read from the file). Throws IoError when it cannot be
  /// opened (the creator exited or /proc is not readable) or has another size.
  static ShmFile openPeer(int pid, int fd, size_t bytes);

  ShmFile() = default;
  ShmFile(ShmFile&& other) noexcept;
  ShmFile& operator=(ShmFile&& other) noexcept;
  ShmFile(const ShmFile&) = delete;
  ShmFile& operator=(const ShmFile&) = delete;
  ~ShmFile();

  void* data() const { return base_; }
  size_t bytes() const { return bytes_; }
  /// The descriptor peers open through /proc; -1 once closed.
  int fd() const { return fd_; }
  /// Closes the descriptor (the mapping stays). Call once every peer has mapped the file.
  void closeFd();

 private:
  void release();

  void* base_ = nullptr;
  size_t bytes_ = 0;
  int fd_ = -1;
};

/// This host's identity for shared memory: host name, boot id and network namespace.
/// Processes with equal ids can map each other's files (network namespaces stand for hosts
/// in the multi-host tests, so they count as different hosts).
std::string machineHostId();

/// Bytes of shared memory a new file may still take on this host, and where that limit
/// comes from ("/dev/shm" or "memory"), for errors raised before anything is reserved.
size_t shmBytesAvailable(std::string* where);

}  // namespace kolo::comm::detail
