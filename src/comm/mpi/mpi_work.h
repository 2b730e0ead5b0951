// MpiWork: the handle of a non-blocking MPI operation (isend, irecv, iallreduce,
// ibroadcast). wait() polls MPI_Test against a deadline; a completion step (the Avg divide,
// the received-count check) runs once, on the thread that observes completion.
#pragma once

#if KOLO_HAVE_MPI

// The C API only: the deprecated C++ bindings would need libmpi_cxx.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "comm/observed_ops.h"
#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

class MpiCommunicator;

class MpiWork final : public Work {
 public:
  using Finish = std::function<void(const MPI_Status&)>;
  /// Keeps `owner` alive until the operation completes. `what` names the operation in errors;
  /// `collective` says whether a Timeout leaves the communicator unusable. `record` is the
  /// operation's flight-recorder entry and span, finished when completion is seen.
  MpiWork(std::shared_ptr<MpiCommunicator> owner, MPI_Request request, std::string what, Finish finish,
          bool collective, PendingOp record = {});

  void wait(std::chrono::milliseconds timeout) override;
  bool test() override;
  int source() const override { return source_; }
  /// The operation is a receive: completion records its sender for source().
  void markReceive() { receive_ = true; }

 private:
  void complete(const MPI_Status& status);

  std::shared_ptr<MpiCommunicator> owner_;
  MPI_Request request_;
  std::string what_;
  Finish finish_;
  bool collective_;
  PendingOp record_;
  bool done_ = false;
  bool receive_ = false;
  int source_ = -1;
  std::exception_ptr error_;
};

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
