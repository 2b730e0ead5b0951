// Tests of setNumThreads / numThreads: the count reaches OpenBLAS and comes back, a bad
// count is refused, and a product gives the same result on one thread or two.
#include "kolo/threads.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include "kolo/error.h"
#include "tensor/kernels.h"

namespace kolo {
namespace {

// Restores the thread count a test found.
struct ThreadCountGuard {
  int saved = numThreads();
  ~ThreadCountGuard() { setNumThreads(saved); }
};

TEST(Threads, SetReachesOpenBlasAndReadsBack) {
  ThreadCountGuard guard;
  setNumThreads(1);
  EXPECT_EQ(numThreads(), 1);
  EXPECT_EQ(openblas_get_num_threads(), 1);
  setNumThreads(2);
  EXPECT_EQ(numThreads(), 2);
  EXPECT_EQ(openblas_get_num_threads(), 2);
}

TEST(Threads, RefusesLessThanOne) {
  ThreadCountGuard guard;
  setNumThreads(1);
  EXPECT_THROW(setNumThreads(0), InvalidArgument);
  EXPECT_THROW(setNumThreads(-3), InvalidArgument);
  EXPECT_EQ(numThreads(), 1);
}

TEST(Threads, ProductsAgreeOnOneAndTwoThreads) {
  ThreadCountGuard guard;
  Generator gen(3);
  Tensor a = Tensor::randn({96, 200}, gen), b = Tensor::randn({200, 64}, gen);
  setNumThreads(1);
  const std::vector<float> one = kernels::matmul2d(a, b).toFloatVector();
  setNumThreads(2);
  const std::vector<float> two = kernels::matmul2d(a, b).toFloatVector();
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) EXPECT_NEAR(one[i], two[i], 1e-3) << i;
}

}  // namespace
}  // namespace kolo
