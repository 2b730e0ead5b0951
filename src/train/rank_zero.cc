// loadOnRankZero (rank_zero.h).
#include "train/rank_zero.h"

#include <exception>

#include "kolo/error.h"

namespace kolo::train::detail {

void loadOnRankZero(comm::Communicator* comm, int rank, const std::function<void()>& load,
                    const std::string& what) {
  int64_t loaded = 1;
  std::exception_ptr problem;
  if (rank == 0) {
    try {
      load();
    } catch (const Error&) {
      loaded = 0;
      problem = std::current_exception();
    }
  }
  if (comm && comm->size() > 1) comm->broadcast(&loaded, 1, DType::I64, 0);
  if (loaded != 0) return;
  if (problem) std::rethrow_exception(problem);
  KOLO_THROW(PeerError, "rank ", rank, ": rank 0 could not ", what);
}

}  // namespace kolo::train::detail
