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

/// `count` elements of `dtype`, read and written as doubles (values must be representable).
class Buffer {
 public:
  Buffer(DType dtype, size_t count) : dtype_(dtype), bytes_(count * dtypeSize(dtype) + 1) {}
  void* data() { return bytes_.data(); }
  void* at(size_t i) { return bytes_.data() + i * dtypeSize(dtype_); }
  void fill(double value) {
    for (size_t i = 0; i + 1 < bytes_.size(); i += dtypeSize(dtype_)) set(i / dtypeSize(dtype_), value);
  }
  void set(size_t i, double v) { storeElement(dtype_, bytes_.data(), i, v); }
  double get(size_t i) { return loadElement(dtype_, bytes_.data(), i); }

 private:
  DType dtype_;
  std::vector<uint8_t> bytes_;  // one spare byte so that data() is never null
};

}  // namespace kolo::comm::test
