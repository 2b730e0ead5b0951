// Main of the MPI backend tests: creates the world communicator (which initialises MPI),
// lets only rank 0 print the full GoogleTest report (other ranks print their failures,
// prefixed with the rank), and exits with 77 (ctest SKIP) when kolo was built without MPI.
#include <gtest/gtest.h>

#include <cstdio>

#include "kolo/comm/mpi.h"
#include "mpi_test_support.h"

namespace kolo::comm::test {

std::shared_ptr<Communicator>& worldSlot() {
  static std::shared_ptr<Communicator> slot;
  return slot;
}

namespace {

class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.summary());
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace kolo::comm::test

int main(int argc, char** argv) {
  using namespace kolo::comm;
  ::testing::InitGoogleTest(&argc, argv);
  if (!mpiAvailable()) {
    std::printf("SKIPPED: kolo was built without the MPI backend (KOLO_WITH_MPI=OFF or Open MPI not found)\n");
    return 77;
  }
  MpiOptions options;
  options.timeout = std::chrono::seconds(60);  // a rank that fails early must not hang the rest
  test::worldSlot() = createMpiCommunicator(options);
  const int rank = test::worldSlot()->rank();
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new test::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS();
  // Every rank learns whether any rank failed, so mpirun's exit code reflects them all.
  int anyFailed = failed ? 1 : 0;
  try {
    test::worldSlot()->allreduce(&anyFailed, &anyFailed, 1, kolo::DType::I32, ReduceOp::Max);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] final agreement failed: %s\n", rank, e.what());
    anyFailed = 1;
  }
  test::worldSlot().reset();  // finalises MPI
  return anyFailed ? 1 : 0;
}
