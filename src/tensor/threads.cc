// setNumThreads / numThreads over OpenBLAS's thread pool, the only intra-op parallelism.
#include "kolo/threads.h"

#include <cblas.h>

#include "kolo/error.h"

namespace kolo {

void setNumThreads(int n) {
  KOLO_REQUIRE(n >= 1, "setNumThreads: the thread count must be at least 1, got ", n);
  openblas_set_num_threads(n);
}

int numThreads() { return openblas_get_num_threads(); }

}  // namespace kolo
