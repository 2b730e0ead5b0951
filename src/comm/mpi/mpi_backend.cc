// Entry points of the MPI backend (include/kolo/comm/mpi.h): availability, options from
// the environment, and the world communicator. Without KOLO_HAVE_MPI they report that the
// backend is missing instead of failing to link.
#include <cstdlib>
#include <string>

#include "kolo/comm/mpi.h"
#include "kolo/error.h"
#include "kolo/settings.h"

#if KOLO_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#include "comm/mpi/mpi_observers.h"
#endif

namespace kolo::comm {

MpiOptions mpiOptionsFromEnvironment() {
  const settings::Environment env = settings::Environment::process();
  MpiOptions options;
  options.checkSignatures = settings::checkSignatures(env);
  options.blockingCollectives = settings::mpiBlocking(env);
  options.algorithm = parseAlgorithm(settings::algo(env));
  return options;
}

std::shared_ptr<Communicator> createMpiCommunicator() { return createMpiCommunicator(mpiOptionsFromEnvironment()); }

#if KOLO_HAVE_MPI

namespace {

// Open MPI picks its all-reduce algorithm from MCA parameters that it reads at MPI_Init:
// libnbc's for the non-blocking calls (the default mode), tuned's for the blocking ones
// (KOLO_MPI_BLOCKING). Variables the user set already are left as they are.
void forceOpenMpiAllreduce(Algorithm algorithm) {
  const char* nonBlocking = nullptr;  // coll_libnbc_iallreduce_algorithm
  const char* blocking = nullptr;     // coll_tuned_allreduce_algorithm
  switch (algorithm) {
    case Algorithm::Ring: nonBlocking = "1", blocking = "4"; break;
    case Algorithm::HalvingDoubling: nonBlocking = "3", blocking = "6"; break;  // Rabenseifner
    case Algorithm::Tree:
    case Algorithm::ReduceBroadcast: nonBlocking = "2", blocking = "2"; break;  // reduce + bcast
    case Algorithm::Auto: return;
    case Algorithm::Hierarchical:
      KOLO_THROW(InvalidArgument, "all-reduce algorithm '", algorithmName(algorithm),
                 "' (KOLO_ALGO) is not available with the MPI backend: use auto, ring, "
                 "halving-doubling, tree or reduce-broadcast, or the native backend");
  }
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (initialised)
    KOLO_THROW(InvalidArgument, "all-reduce algorithm '", algorithmName(algorithm),
               "' (KOLO_ALGO) must be chosen before MPI_Init, and this program initialised MPI "
               "itself: unset KOLO_ALGO, or set OMPI_MCA_coll_tuned_allreduce_algorithm and "
               "OMPI_MCA_coll_libnbc_iallreduce_algorithm instead");
  ::setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", nonBlocking, 0);
  ::setenv("OMPI_MCA_coll_tuned_use_dynamic_rules", "1", 0);
  ::setenv("OMPI_MCA_coll_tuned_allreduce_algorithm", blocking, 0);
}

}  // namespace

bool mpiAvailable() { return true; }

std::shared_ptr<Communicator> createMpiCommunicator(const MpiOptions& options) {
  KOLO_CHECK(options.timeout.count() > 0, "MPI communicator timeout must be positive, got ", options.timeout.count(),
             " ms");
  if (options.algorithm != Algorithm::Auto) forceOpenMpiAllreduce(options.algorithm);
  auto runtime = std::make_shared<detail::MpiRuntime>();
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) detail::throwMpiError(rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
  auto communicator = std::make_shared<detail::MpiCommunicator>(std::move(runtime), world, options);
  communicator->setContext(detail::joinMpiObservers(*communicator));
  return communicator;
}

#else

bool mpiAvailable() { return false; }

std::shared_ptr<Communicator> createMpiCommunicator(const MpiOptions&) {
  KOLO_THROW(Error,
             "the MPI backend is not available: kolo was built without MPI (install libopenmpi-dev and configure "
             "with -DKOLO_WITH_MPI=ON), use the native backend instead");
}

#endif

}  // namespace kolo::comm
