// The threads one rank uses inside an operation (torch::set_num_threads): GEMM, and so
// linear layers and convolution, runs on OpenBLAS's thread pool; kolo's own kernels run on
// the calling thread. Data parallelism adds ranks or replicas, not intra-op threads.
#pragma once

namespace kolo {

/// Sets the number of threads an operation may use (OpenBLAS's pool). Process-wide: call it
/// before training, not while operations run on other threads. One thread is what several
/// ranks or replicas per host want (they already fill the cores), and it lets f32 products
/// with a small batch or inner dimension take kolo's AVX-512 kernels. Throws
/// InvalidArgument for n < 1.
void setNumThreads(int n);

/// The number of threads an operation may use (OpenBLAS's current setting; its default is
/// the number of cores, or OPENBLAS_NUM_THREADS).
int numThreads();

}  // namespace kolo
