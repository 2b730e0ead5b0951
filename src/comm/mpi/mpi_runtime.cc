// MPI lifetime, f16/bf16 reduction ops (the comm layer's kernels), dtype mapping and the
// translation of MPI error codes into kolo exceptions.
#include "comm/mpi/mpi_runtime.h"

#if KOLO_HAVE_MPI

#include <algorithm>
#include <climits>
#include <cstdint>

#include "comm/algorithms/reduce_kernels.h"
#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

// MPI user function for f16 and bf16: inout[i] = inout[i] op in[i] by the comm layer's
// kernels, which widen each value to f32 and round the result back once, as the native
// backend's reductions do.
template <DType dtype, ReduceOp op>
void halfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  reduceInto(inout, in, static_cast<size_t>(*len), dtype, op);
}

template <DType dtype>
std::array<MPI_Op, 4> createHalfOps() {
  std::array<MPI_Op, 4> ops{};
  MPI_Op_create(&halfReduce<dtype, ReduceOp::Sum>, 1, &ops[0]);
  MPI_Op_create(&halfReduce<dtype, ReduceOp::Prod>, 1, &ops[1]);
  MPI_Op_create(&halfReduce<dtype, ReduceOp::Min>, 1, &ops[2]);
  MPI_Op_create(&halfReduce<dtype, ReduceOp::Max>, 1, &ops[3]);
  return ops;
}

int opIndex(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return 0;
    case ReduceOp::Prod: return 1;
    case ReduceOp::Min: return 2;
    case ReduceOp::Max: return 3;
  }
  KOLO_THROW(InvalidArgument, "unknown reduce op code ", static_cast<int>(op));
}

}  // namespace

MpiRuntime::MpiRuntime() {
  int initialised = 0;
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (finalised) {
    KOLO_THROW(Error, "MPI backend: MPI was already finalised in this process and cannot be initialised again");
  }
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) throwMpiError(rc, "MPI_Init_thread");
    ownsMpi_ = true;
  }
  MPI_Query_thread(&threadLevel_);
  halfOps_[0] = createHalfOps<DType::F16>();
  halfOps_[1] = createHalfOps<DType::BF16>();
}

MpiRuntime::~MpiRuntime() {
  for (auto& ops : halfOps_) {
    for (MPI_Op& op : ops) {
      if (op != MPI_OP_NULL) MPI_Op_free(&op);
    }
  }
  int finalised = 0;
  MPI_Finalized(&finalised);
  if (ownsMpi_ && !finalised) MPI_Finalize();
}

MPI_Op MpiRuntime::reduceOp(DType dtype, ReduceOp op) const {
  if (dtype == DType::F16) return halfOps_[0][opIndex(op)];
  if (dtype == DType::BF16) return halfOps_[1][opIndex(op)];
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Prod: return MPI_PROD;
    case ReduceOp::Min: return MPI_MIN;
    case ReduceOp::Max: return MPI_MAX;
  }
  KOLO_THROW(InvalidArgument, "unknown reduce op code ", static_cast<int>(op));
}

MPI_Datatype mpiDatatype(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::F16:
    case DType::BF16: return MPI_UINT16_T;
    case DType::I32: return MPI_INT32_T;
    case DType::I64: return MPI_INT64_T;
    case DType::U8: return MPI_UINT8_T;
  }
  KOLO_THROW(InvalidArgument, "unknown dtype code ", static_cast<int>(dtype));
}

void throwMpiError(int code, const std::string& what) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int length = 0;
  MPI_Error_string(code, text, &length);
  int errorClass = code;
  MPI_Error_class(code, &errorClass);
  const std::string message = what + " failed: " + std::string(text, static_cast<size_t>(length)) +
                              " (MPI error class " + std::to_string(errorClass) + ")";
  switch (errorClass) {
    case MPI_ERR_TRUNCATE: throw Mismatch(message);
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_TAG:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_ARG:
    case MPI_ERR_BUFFER:
    case MPI_ERR_OP: throw InvalidArgument(message);
    default: throw IoError(message);
  }
}

int mpiCount(size_t count, const char* call) {
  if (count > static_cast<size_t>(INT_MAX)) {
    KOLO_THROW(InvalidArgument, call, ": count ", count, " exceeds MPI's limit of ", INT_MAX,
               " elements per call in the MPI backend");
  }
  return static_cast<int>(count);
}

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
