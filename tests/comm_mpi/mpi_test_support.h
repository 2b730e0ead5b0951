// Helpers for the MPI backend tests: the world communicator that the test main creates,
// and a typed buffer that reads and writes elements of any kolo dtype as doubles.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/dtype.h"

namespace kolo::comm::test {

/// The communicator over all ranks of the mpirun job, created once by the test main.
std::shared_ptr<Communicator>& worldSlot();
inline std::shared_ptr<Communicator> world() { return worldSlot(); }

/// OMPI_COMM_WORLD_SIZE as mpirun set it (1 when started without mpirun).
inline int mpiWorldSizeFromEnvironment() {
  const char* value = std::getenv("OMPI_COMM_WORLD_SIZE");
  return value ? std::atoi(value) : 1;
}

inline std::string reduceOpLabel(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
  }
  return "unknown";
}

/// `count` elements of `dtype`, read and written as doubles (values must be representable).
class Buffer {
 public:
  Buffer(DType dtype, size_t count) : dtype_(dtype), bytes_(count * dtypeSize(dtype) + 1) {}
  void* data() { return bytes_.data(); }
  void* at(size_t i) { return bytes_.data() + i * dtypeSize(dtype_); }
  void fill(double value) {
    for (size_t i = 0; i + 1 < bytes_.size(); i += dtypeSize(dtype_)) set(i / dtypeSize(dtype_), value);
  }
  void set(size_t i, double v) {
    void* p = at(i);
    switch (dtype_) {
      case DType::F32: { float x = static_cast<float>(v); std::memcpy(p, &x, 4); break; }
      case DType::F64: std::memcpy(p, &v, 8); break;
      case DType::F16: { uint16_t x = floatToHalf(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
      case DType::BF16: { uint16_t x = floatToBFloat16(static_cast<float>(v)); std::memcpy(p, &x, 2); break; }
      case DType::I32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
      case DType::I64: { int64_t x = static_cast<int64_t>(v); std::memcpy(p, &x, 8); break; }
      case DType::U8: { uint8_t x = static_cast<uint8_t>(v); std::memcpy(p, &x, 1); break; }
    }
  }
  double get(size_t i) {
    const void* p = at(i);
    switch (dtype_) {
      case DType::F32: { float x; std::memcpy(&x, p, 4); return x; }
      case DType::F64: { double x; std::memcpy(&x, p, 8); return x; }
      case DType::F16: { uint16_t x; std::memcpy(&x, p, 2); return halfToFloat(x); }
      case DType::BF16: { uint16_t x; std::memcpy(&x, p, 2); return bfloat16ToFloat(x); }
      case DType::I32: { int32_t x; std::memcpy(&x, p, 4); return x; }
      case DType::I64: { int64_t x; std::memcpy(&x, p, 8); return static_cast<double>(x); }
      case DType::U8: { uint8_t x; std::memcpy(&x, p, 1); return x; }
    }
    return 0;
  }

 private:
  DType dtype_;
  std::vector<uint8_t> bytes_;  // one spare byte so that data() is never null
};

}  // namespace kolo::comm::test
