// The native backend's SharedWindow: one POSIX shared-memory object per rank, mapped by
// every rank of the (single-host) group; names travel by allgather and are unlinked as
// soon as every rank has mapped them, so nothing is left behind in /dev/shm.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"

namespace kolo::comm::native {

/// Mappings of every rank's part; unmapped by the destructor.
class NativeSharedWindow : public SharedWindow {
 public:
  NativeSharedWindow(size_t bytes, int rank, std::vector<void*> parts);
  ~NativeSharedWindow() override;
  NativeSharedWindow(const NativeSharedWindow&) = delete;
  NativeSharedWindow& operator=(const NativeSharedWindow&) = delete;

  size_t bytes() const override { return bytes_; }
  void* local() override { return parts_[static_cast<size_t>(rank_)]; }
  void* part(int rank) override;

 private:
  size_t bytes_;
  int rank_;
  std::vector<void*> parts_;
};

/// Creates (O_EXCL) and maps a zero-filled shared-memory object `name` of `bytes`.
/// Returns nullptr with `error` set on failure (the object is then removed).
void* createSharedPart(const std::string& name, size_t bytes, std::string& error);
/// Maps the existing object `name` of exactly `bytes`; nullptr with `error` on failure.
void* openSharedPart(const std::string& name, size_t bytes, std::string& error);
/// Unmaps a part returned by createSharedPart/openSharedPart.
void unmapSharedPart(void* part, size_t bytes);

}  // namespace kolo::comm::native
