// The resnet's convolutions one by one at batch 128 on one thread: forward, the input's
// gradient and the weight's gradient of each (kernels::conv2dForward / conv2dBackward), the
// fastest of 15 runs in this thread's CPU time, with its GFLOP/s. Where a step's convolution
// time goes, shape by shape (bench/train_step times the whole step).
// Usage: resnet_convs
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <vector>

#include "kolo/tensor.h"
#include "kolo/threads.h"
#include "tensor/kernels.h"

using namespace kolo;

namespace {

double cpuMs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return 1e3 * static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_nsec);
}

struct Shape2d {
  const char* name;
  int64_t c, h, o, k, s, p;  // channels in, height = width, channels out, kernel, stride, padding
};

}  // namespace

int main() {
  setNumThreads(1);
  const Shape2d shapes[] = {{"conv1", 1, 28, 16, 3, 1, 1},
                            {"layer1.conv", 16, 28, 16, 3, 1, 1},
                            {"layer2.conv1", 16, 28, 32, 3, 2, 1},
                            {"layer2.conv2", 32, 14, 32, 3, 1, 1},
                            {"layer2.shortcut", 16, 28, 32, 1, 2, 0},
                            {"layer3.conv1", 32, 14, 64, 3, 2, 1},
                            {"layer3.conv2", 64, 7, 64, 3, 1, 1},
                            {"layer3.shortcut", 32, 14, 64, 1, 2, 0}};
  Generator gen(1);
  const int64_t n = 128;
  for (const auto& s : shapes) {
    Tensor x = Tensor::rand({n, s.c, s.h, s.h}, gen, -1, 1);
    Tensor w = Tensor::rand({s.o, s.c, s.k, s.k}, gen, -1, 1);
    kernels::Conv2dParams p{s.s, s.s, s.p, s.p};
    Tensor y = kernels::conv2dForward(x, w, Tensor(), p);
    Tensor g = Tensor::rand(y.shape(), gen, -1, 1);
    double f = 1e9, bx = 1e9, bw = 1e9;
    for (int r = 0; r < 15; ++r) {
      const double t0 = cpuMs();
      const Tensor out = kernels::conv2dForward(x, w, Tensor(), p);
      const double t1 = cpuMs();
      Tensor gx, gw;
      kernels::conv2dBackward(g, x, w, p, &gx, nullptr, nullptr);
      const double t2 = cpuMs();
      kernels::conv2dBackward(g, x, w, p, nullptr, &gw, nullptr);
      const double t3 = cpuMs();
      f = std::min(f, t1 - t0);
      bx = std::min(bx, t2 - t1);
      bw = std::min(bw, t3 - t2);
    }
    const double gf =
        2.0 * static_cast<double>(n * s.o * s.c * s.k * s.k * y.shape()[2] * y.shape()[3]) / 1e6;
    std::printf(
        "%-15s forward %6.2f ms (%5.1f GFLOP/s)  input grad %6.2f (%5.1f)  weight grad %6.2f "
        "(%5.1f)\n",
        s.name, f, gf / f, bx, gf / bx, bw, gf / bw);
  }
}
