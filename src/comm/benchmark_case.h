// One collective at one size, as benchmarkCollective measures it and bench/soak checks it:
// its buffers, how to fill them (values with a closed-form result, or zeros for timing),
// how to run it once, and how to check it.
#pragma once

#include <cstdint>
#include <vector>

#include "kolo/comm/benchmark.h"
#include "kolo/comm/communicator.h"

namespace kolo::comm::detail {

class BenchmarkCase {
 public:
  /// Sizes the buffers for `requestedBytes` (rounded down to whole elements; for the
  /// collectives that split the message, to whole elements per rank). Reads the
  /// collective, dtype, op, root and inPlace of `options`, which must outlive the case.
  BenchmarkCase(Communicator& comm, const BenchmarkOptions& options, size_t requestedBytes);

  /// Bytes the operation moves in nccl-tests' sense (the whole message).
  size_t bytes() const { return bytes_; }
  /// Elements per call argument (per rank's block for the split collectives).
  size_t count() const { return count_; }

  /// Inputs with values whose result is known in closed form; outputs set to a sentinel.
  void fillForCheck();
  /// All-zero inputs, so repeated in-place operations keep values finite.
  void fillZeros();
  /// One operation.
  void run(const CollectiveOptions& options);
  /// After fillForCheck() + run(): whether this rank's outputs hold the expected values.
  bool verify() const;

 private:
  void* sendPtr();
  void* recvPtr();

  Communicator& comm_;
  const BenchmarkOptions& options_;
  int rank_;
  int size_;
  size_t count_ = 0;
  size_t bytes_ = 0;
  size_t sendElements_ = 0;
  size_t recvElements_ = 0;
  std::vector<uint8_t> send_;
  std::vector<uint8_t> recv_;
};

}  // namespace kolo::comm::detail
