// The MPI communicator backend over Open MPI: same Communicator API, used when the
// program runs under mpirun/srun or when asked for. Built only with KOLO_WITH_MPI.
#pragma once

#include <memory>

#include "kolo/comm/communicator.h"

namespace kolo::comm {

/// True when kolo was built with the MPI backend.
bool mpiAvailable();

/// Initialises MPI (if not yet) and returns a communicator over MPI_COMM_WORLD. Throws
/// kolo::Error when the MPI backend was not built.
std::shared_ptr<Communicator> createMpiCommunicator();

}  // namespace kolo::comm
