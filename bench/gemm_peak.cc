// This core's product rate against its own ceiling: the fp32 FMA peak of one thread (12
// independent chains of 16-lane AVX-512 FMAs, or 8-lane AVX2 where AVX-512 is missing), and
// kolo::matmul's GFLOP/s on the `lm`'s products (rows B·T = 1024 at the default size: the
// attention's qkv and output projections, the MLP's two layers, the head), as a fraction of
// that peak. One JSON line per case; bench/gemm_vs_torch.sh runs torch.mm on the same shapes.
// Usage: gemm_peak [--rows R] [--width C] [--repeats N]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "kolo/ops.h"
#include "kolo/tensor.h"
#include "kolo/threads.h"

namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); }

constexpr long kIterations = 50'000'000;

// GFLOP/s of 12 independent FMA chains of `lanes` lanes that took `elapsed` seconds.
double chainRate(double elapsed, int lanes) { return kIterations * 12.0 * lanes * 2 / elapsed / 1e9; }

__attribute__((target("avx512f"))) double avx512Peak() {
  const __m512 one = _mm512_set1_ps(1.0f), tiny = _mm512_set1_ps(1e-9f);
  __m512 acc[12];
  for (__m512& a : acc) a = tiny;
  const auto start = Clock::now();
  for (long k = 0; k < kIterations; ++k) {
#pragma GCC unroll 12
    for (__m512& a : acc) a = _mm512_fmadd_ps(a, one, tiny);
  }
  const double elapsed = seconds(start);
  alignas(64) float lanes[16];
  volatile float sink = 0;
  for (__m512& a : acc) {
    _mm512_store_ps(lanes, a);
    sink = sink + lanes[0];
  }
  return chainRate(elapsed, 16);
}

__attribute__((target("avx2,fma"))) double avx2Peak() {
  const __m256 one = _mm256_set1_ps(1.0f), tiny = _mm256_set1_ps(1e-9f);
  __m256 acc[12];
  for (__m256& a : acc) a = tiny;
  const auto start = Clock::now();
  for (long k = 0; k < kIterations; ++k) {
#pragma GCC unroll 12
    for (__m256& a : acc) a = _mm256_fmadd_ps(a, one, tiny);
  }
  const double elapsed = seconds(start);
  volatile float sink = 0;
  alignas(32) float lanes[8];
  for (__m256& a : acc) {
    _mm256_store_ps(lanes, a);
    sink = sink + lanes[0];
  }
  return chainRate(elapsed, 8);
}

// The best of three measurements: the rate the core reaches when nothing else runs on it.
double fmaPeak(const char** isa) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  *isa = avx512 ? "avx512" : "avx2";
  double best = 0.0;
  for (int i = 0; i < 3; ++i) best = std::max(best, avx512 ? avx512Peak() : avx2Peak());
  return best;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int64_t rows = 1024, width = 128;
  int repeats = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--rows")) rows = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--width")) width = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) repeats = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "gemm_peak: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  kolo::setNumThreads(1);
  const char* isa = "";
  const double peak = fmaPeak(&isa);
  std::printf("{\"bench\": \"fma_peak\", \"isa\": \"%s\", \"gflops\": %.1f}\n", isa, peak);
  const int64_t c = width;
  // Each linear layer of the lm (in features k, out features n): qkv, the attention's output,
  // the MLP's up and down, the head (vocabulary 256). A step takes three products of each:
  // the forward x W^T, the input gradient dY W and the weight gradient dY^T x.
  const int64_t shapes[][2] = {{c, 3 * c}, {c, c}, {c, 4 * c}, {4 * c, c}, {c, 256}};
  kolo::Generator gen(1);
  for (const auto& [k, n] : shapes) {
    const kolo::Tensor x = kolo::Tensor::rand({rows, k}, gen, -1.0, 1.0);
    const kolo::Tensor w = kolo::Tensor::rand({n, k}, gen, -1.0, 1.0);
    const kolo::Tensor dy = kolo::Tensor::rand({rows, n}, gen, -1.0, 1.0);
    const kolo::Tensor none;
    const std::pair<const char*, std::function<kolo::Tensor()>> kinds[] = {
        {"forward", [&] { return kolo::linear(x, w, none); }},
        {"input_grad", [&] { return kolo::matmul(dy, w); }},
        {"weight_grad", [&] { return kolo::matmul(dy.transpose(0, 1), x); }},
    };
    for (const auto& [kind, product] : kinds) {
      std::vector<double> times;
      for (int r = 0; r < repeats + 5; ++r) {
        const auto start = Clock::now();
        const kolo::Tensor out = product();
        if (r >= 5) times.push_back(seconds(start));
      }
      const double gflops = 2.0 * rows * k * n / median(times) / 1e9;
      std::printf("{\"bench\": \"kolo_gemm\", \"kind\": \"%s\", \"m\": %lld, \"k\": %lld, \"n\": %lld, "
                  "\"gflops\": %.1f, \"of_peak\": %.3f}\n",
                  kind, static_cast<long long>(rows), static_cast<long long>(k), static_cast<long long>(n), gflops,
                  gflops / peak);
    }
  }
  return 0;
}
