// The MPI communicator backend over Open MPI: same Communicator API, used when the
// program runs under mpirun/srun or when asked for. Built only with KOLO_WITH_MPI; without
// it mpiAvailable() is false and createMpiCommunicator() throws kolo::Error.
#pragma once

#include <chrono>
#include <memory>

#include "kolo/comm/communicator.h"

namespace kolo::comm {

/// True when kolo was built with the MPI backend.
bool mpiAvailable();

/// Settings of an MPI communicator (see docs/comm.md, "MPI backend").
struct MpiOptions {
  /// Default deadline of every wait; CollectiveOptions::timeout overrides it per call.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  /// Before every collective, all ranks exchange its signature (sequence number, operation,
  /// dtype, count, root, reduction) and throw Mismatch naming both sides when they differ.
  /// Costs one small allgather per collective. Environment: KOLO_CHECK_SIGNATURES=1.
  bool checkSignatures = false;
  /// Run blocking collectives as MPI's blocking calls (Open MPI's tuned algorithms, lowest
  /// latency) instead of non-blocking calls polled against the deadline. A stuck peer then
  /// blocks forever instead of raising Timeout. Environment: KOLO_MPI_BLOCKING=1.
  bool blockingCollectives = false;
  /// All-reduce algorithm forced on Open MPI (environment: KOLO_ALGO). Auto leaves the choice
  /// to Open MPI; ring, halving-doubling (Rabenseifner's), tree and reduce-broadcast (both:
  /// reduce then broadcast) become Open MPI's MCA parameters before MPI_Init, for blocking and
  /// non-blocking calls alike. Hierarchical, or any algorithm but Auto when the program
  /// initialised MPI itself, is an InvalidArgument from createMpiCommunicator().
  Algorithm algorithm = Algorithm::Auto;
};

/// Reads KOLO_CHECK_SIGNATURES, KOLO_MPI_BLOCKING and KOLO_ALGO through the settings
/// registry (kolo/settings.h); the timeout keeps its default. Throws InvalidArgument for
/// values it cannot read.
MpiOptions mpiOptionsFromEnvironment();

/// Initialises MPI (if not yet; with MPI_THREAD_MULTIPLE requested) and returns a
/// communicator over a duplicate of MPI_COMM_WORLD. MPI is finalised when the last
/// communicator that initialised it is destroyed. Throws kolo::Error when the MPI backend
/// was not built, or when MPI was already finalised in this process.
std::shared_ptr<Communicator> createMpiCommunicator(const MpiOptions& options);

/// createMpiCommunicator(mpiOptionsFromEnvironment()).
std::shared_ptr<Communicator> createMpiCommunicator();

}  // namespace kolo::comm
