// SharedWindow over unnamed shared-memory files (see shared_window.h and shm_file.h).
#include "comm/shared_window.h"

#include <unistd.h>

#include <cstring>
#include <vector>

#include "comm/shm_file.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

// Mappings of every rank's part; unmapped by the destructor.
class ShmFileWindow : public SharedWindow {
 public:
  ShmFileWindow(size_t bytes, int rank, std::vector<ShmFile> parts)
      : bytes_(bytes), rank_(rank), parts_(std::move(parts)) {}

  size_t bytes() const override { return bytes_; }
  void* local() override { return parts_[static_cast<size_t>(rank_)].data(); }
  void* part(int rank) override {
    KOLO_CHECK(rank >= 0 && static_cast<size_t>(rank) < parts_.size(), "shared window: rank ",
               rank, " is not in the group of ", parts_.size());
    return parts_[static_cast<size_t>(rank)].data();
  }

 private:
  size_t bytes_;
  int rank_;
  std::vector<ShmFile> parts_;
};

// What each rank tells the others about its part.
struct PartRecord {
  int32_t ok;
  int32_t pid;
  int32_t fd;
};

}  // namespace

std::shared_ptr<SharedWindow> allocatePosixSharedWindow(Communicator& comm, size_t bytes,
                                                        uint64_t tag) {
  const int n = comm.size();
  const int me = comm.rank();
  std::vector<ShmFile> parts(static_cast<size_t>(n));
  PartRecord mine{0, static_cast<int32_t>(getpid()), -1};
  try {
    parts[static_cast<size_t>(me)] = ShmFile::create("kolo-window-" + std::to_string(tag), bytes);
    mine = {1, static_cast<int32_t>(getpid()), parts[static_cast<size_t>(me)].fd()};
  } catch (const IoError&) {
    // Not enough shared memory here: every rank learns it below and gets no window.
  }
  std::vector<PartRecord> records(static_cast<size_t>(n));
  comm.allgather(&mine, records.data(), sizeof(PartRecord), DType::U8);
  int32_t ok = 1;
  for (const auto& r : records) ok &= r.ok;
  for (int r = 0; ok && r < n; ++r) {
    if (r == me) continue;
    try {
      parts[static_cast<size_t>(r)] = ShmFile::openPeer(records[r].pid, records[r].fd, bytes);
    } catch (const IoError&) {
      ok = 0;
    }
  }
  // Every rank has mapped every part (or one failed) before any creator closes its file.
  int32_t all = ok;
  comm.allreduce(&ok, &all, 1, DType::I32, ReduceOp::Min);
  parts[static_cast<size_t>(me)].closeFd();
  if (!all) return nullptr;
  return std::make_shared<ShmFileWindow>(bytes, me, std::move(parts));
}

}  // namespace kolo::comm::detail
