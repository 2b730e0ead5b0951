// MPI plumbing shared by the MPI communicator: the process-wide MPI lifetime (init,
// user-defined reduction ops for f16/bf16, finalize) held by shared ownership, the
// dtype/op mapping, and the one place where MPI status codes become kolo exceptions.
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

#include <array>
#include <memory>
#include <string>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::detail {

/// Owns MPI's initialisation: the first runtime of a process calls MPI_Init_thread and, when
/// the last communicator holding it goes away, MPI_Finalize. Also owns the user-defined
/// reduction ops for the half-precision types (MPI 3.1 has no f16/bf16).
class MpiRuntime {
 public:
  /// Initialises MPI unless already initialised; throws Error if MPI was finalised.
  MpiRuntime();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  /// The MPI_Op for (dtype, op); Avg maps to the Sum op (the caller divides afterwards).
  MPI_Op reduceOp(DType dtype, ReduceOp op) const;
  /// Thread level MPI granted.
  int threadLevel() const { return threadLevel_; }

 private:
  bool ownsMpi_ = false;
  int threadLevel_ = MPI_THREAD_SINGLE;
  // [0] f16, [1] bf16; each indexed by Sum, Prod, Min, Max.
  std::array<std::array<MPI_Op, 4>, 2> halfOps_{};
};

/// The MPI datatype that carries `dtype` (f16 and bf16 travel as MPI_UINT16_T).
MPI_Datatype mpiDatatype(DType dtype);

/// Throws the kolo exception for an MPI error code: argument errors -> InvalidArgument,
/// truncation -> Mismatch, everything else -> IoError. `what` names the call and the rank.
[[noreturn]] void throwMpiError(int code, const std::string& what);

/// Checks an MPI return code (communicators use MPI_ERRORS_RETURN).
inline void mpiCheck(int code, const char* call, int rank) {
  if (code != MPI_SUCCESS) throwMpiError(code, std::string(call) + " on rank " + std::to_string(rank));
}

/// Narrows an element count to MPI's int; larger counts are an InvalidArgument.
int mpiCount(size_t count, const char* call);

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
