// Completion of non-blocking MPI operations: deadline-bounded wait, non-blocking test, and
// the error of a failed operation kept and rethrown by every later wait().
#include "comm/mpi/mpi_work.h"

#if KOLO_HAVE_MPI

#include "comm/mpi/mpi_communicator.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

MpiWork::MpiWork(std::shared_ptr<MpiCommunicator> owner, MPI_Request request, std::string what, Finish finish,
                 bool collective, PendingOp record)
    : owner_(std::move(owner)),
      request_(request),
      what_(std::move(what)),
      finish_(std::move(finish)),
      collective_(collective),
      record_(std::move(record)) {}

void MpiWork::wait(std::chrono::milliseconds timeout) {
  if (!done_) {
    MPI_Status status{};
    try {
      owner_->waitRequest(request_, &status, what_, timeout.count() > 0 ? timeout : owner_->timeout(),
                          collective_);
    } catch (const Timeout& e) {
      record_.fail(e, false);
      throw;  // still pending: a later wait may succeed
    } catch (const std::exception& e) {
      done_ = true;
      error_ = std::current_exception();
      record_.fail(e, true);
      throw;
    }
    complete(status);
  }
  if (error_) std::rethrow_exception(error_);
}

bool MpiWork::test() {
  if (done_) return true;
  int flag = 0;
  MPI_Status status{};
  const int rc = MPI_Test(&request_, &flag, &status);
  if (rc != MPI_SUCCESS) {
    done_ = true;
    try {
      throwMpiError(rc, what_);
    } catch (const std::exception& e) {
      error_ = std::current_exception();
      record_.fail(e, true);
    }
    return true;
  }
  if (flag) complete(status);
  return flag != 0;
}

void MpiWork::complete(const MPI_Status& status) {
  done_ = true;
  if (finish_) {
    try {
      finish_(status);
    } catch (const std::exception& e) {
      error_ = std::current_exception();
      record_.fail(e, true);
      return;
    }
  }
  if (receive_) source_ = status.MPI_SOURCE;
  record_.done();
}

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
