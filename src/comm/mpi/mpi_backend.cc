// Entry points of the MPI backend (include/kolo/comm/mpi.h): availability, options from
// the environment, and the world communicator. Without KOLO_HAVE_MPI they report that the
// backend is missing instead of failing to link.
#include <cstdlib>
#include <string>

#include "kolo/comm/mpi.h"
#include "kolo/error.h"

#if KOLO_HAVE_MPI
#include "comm/mpi/mpi_communicator.h"
#endif

namespace kolo::comm {
namespace {

bool envFlag(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return false;
  const std::string text(value);
  if (text.empty() || text == "0" || text == "false" || text == "no" || text == "off") return false;
  if (text == "1" || text == "true" || text == "yes" || text == "on") return true;
  KOLO_THROW(InvalidArgument, "environment variable ", name, "='", text, "' is not a boolean (use 1 or 0)");
}

}  // namespace

MpiOptions mpiOptionsFromEnvironment() {
  MpiOptions options;
  options.checkSignatures = envFlag("KOLO_CHECK_SIGNATURES");
  options.blockingCollectives = envFlag("KOLO_MPI_BLOCKING");
  return options;
}

std::shared_ptr<Communicator> createMpiCommunicator() { return createMpiCommunicator(mpiOptionsFromEnvironment()); }

#if KOLO_HAVE_MPI

bool mpiAvailable() { return true; }

std::shared_ptr<Communicator> createMpiCommunicator(const MpiOptions& options) {
  KOLO_CHECK(options.timeout.count() > 0, "MPI communicator timeout must be positive, got ", options.timeout.count(),
             " ms");
  auto runtime = std::make_shared<detail::MpiRuntime>();
  MPI_Comm world = MPI_COMM_NULL;
  const int rc = MPI_Comm_dup(MPI_COMM_WORLD, &world);
  if (rc != MPI_SUCCESS) detail::throwMpiError(rc, "MPI_Comm_dup(MPI_COMM_WORLD)");
  return std::make_shared<detail::MpiCommunicator>(std::move(runtime), world, options);
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
