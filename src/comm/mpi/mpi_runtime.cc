// MPI lifetime, f16/bf16 reduction ops (converting through f32), dtype mapping and the
// translation of MPI error codes into kolo exceptions.
#include "comm/mpi/mpi_runtime.h"

#if KOLO_HAVE_MPI

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kolo/error.h"

namespace kolo::comm::detail {
namespace {

using HalfToFloat = float (*)(uint16_t);
using FloatToHalf = uint16_t (*)(float);

struct SumF {
  static float apply(float a, float b) { return a + b; }
};
struct ProdF {
  static float apply(float a, float b) { return a * b; }
};
struct MinF {
  static float apply(float a, float b) { return std::min(a, b); }
};
struct MaxF {
  static float apply(float a, float b) { return std::max(a, b); }
};

// MPI user function: inout[i] = in[i] (op) inout[i], each half value widened to f32 and the
// result rounded back once, so one pairwise step rounds exactly as f32 arithmetic would.
template <class Op, HalfToFloat toFloat, FloatToHalf toHalf>
void halfReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = toHalf(Op::apply(toFloat(a[i]), toFloat(b[i])));
}

template <HalfToFloat toFloat, FloatToHalf toHalf>
std::array<MPI_Op, 4> createHalfOps() {
  std::array<MPI_Op, 4> ops{};
  MPI_Op_create(&halfReduce<SumF, toFloat, toHalf>, 1, &ops[0]);
  MPI_Op_create(&halfReduce<ProdF, toFloat, toHalf>, 1, &ops[1]);
  MPI_Op_create(&halfReduce<MinF, toFloat, toHalf>, 1, &ops[2]);
  MPI_Op_create(&halfReduce<MaxF, toFloat, toHalf>, 1, &ops[3]);
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

template <class T>
void divideTyped(void* buf, size_t count, int divisor) {
  T* p = static_cast<T*>(buf);
  for (size_t i = 0; i < count; ++i) p[i] = static_cast<T>(p[i] / static_cast<T>(divisor));
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
  halfOps_[0] = createHalfOps<&halfToFloat, &floatToHalf>();
  halfOps_[1] = createHalfOps<&bfloat16ToFloat, &floatToBFloat16>();
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

void divideInPlace(void* buf, size_t count, DType dtype, int divisor) {
  switch (dtype) {
    case DType::F32: return divideTyped<float>(buf, count, divisor);
    case DType::F64: return divideTyped<double>(buf, count, divisor);
    case DType::I32: return divideTyped<int32_t>(buf, count, divisor);
    case DType::I64: return divideTyped<int64_t>(buf, count, divisor);
    case DType::U8: return divideTyped<uint8_t>(buf, count, divisor);
    case DType::F16:
    case DType::BF16: {
      const bool isHalf = dtype == DType::F16;
      auto* p = static_cast<uint16_t*>(buf);
      const float d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) {
        p[i] = isHalf ? floatToHalf(halfToFloat(p[i]) / d) : floatToBFloat16(bfloat16ToFloat(p[i]) / d);
      }
      return;
    }
  }
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
