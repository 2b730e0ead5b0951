// Tests of the Reducer's communication hooks and the built-in compression hooks, with ranks
// as threads over the native communicator: the all-reduce hook equals the plain reducer bit
// for bit, the 16-bit casts stay within their precision, full-rank PowerSGD and top-k with
// fraction 1 are exact, error feedback loses nothing, and a resumed PowerSGD run continues
// exactly.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>

#include "kolo/error.h"
#include "kolo/parallel/compression.h"
#include "kolo/safetensors.h"
#include "native_ranks.h"
#include "toy_setup.h"

namespace kolo::parallel {
namespace {
using namespace testing;
namespace cz = compression;

using HookFactory = std::function<std::shared_ptr<CommHook>()>;
using Series = std::vector<std::vector<float>>;  // one gradient vector per step

// Deterministic gradients of rank r at step t, with a scale that varies per element.
std::vector<float> gradientOf(int r, int t, size_t n) {
  Generator gen(1000 + 97 * static_cast<uint64_t>(r) + static_cast<uint64_t>(t));
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i)
    g[i] = static_cast<float>(gen.normal() * (1.0 + static_cast<double>(i % 7)));
  return g;
}

struct HookRun {
  std::vector<Series> outputs;                   // [rank][step]
  std::vector<std::shared_ptr<CommHook>> hooks;  // per rank, after the run
};

using Inputs = std::function<std::vector<float>(int rank, int step, size_t n)>;

// Runs `steps` passes of one bucket with parameters of `shapes` through a hook per rank.
HookRun runHook(
    int n, const HookFactory& make, const std::vector<Shape>& shapes, int steps,
    const Inputs& inputs = [](int r, int t, size_t k) { return gradientOf(r, t, k); }) {
  std::vector<size_t> offsets;
  size_t total = 0;
  for (const Shape& s : shapes) {
    offsets.push_back(total);
    size_t numel = 1;
    for (int64_t d : s) numel *= static_cast<size_t>(d);
    total += numel;
  }
  auto comms = nativeRanks(n);
  HookRun run;
  run.outputs.resize(n);
  run.hooks.resize(n);
  runThreads(n, [&](int r) {
    auto comm = comms(r);
    auto hook = make();
    for (int t = 0; t < steps; ++t) {
      GradBucket bucket;
      bucket.count = 1;
      bucket.buffer = Tensor::fromVector({static_cast<int64_t>(total)}, inputs(r, t, total));
      for (size_t j = 0; j < shapes.size(); ++j)
        bucket.names.push_back(std::string("p").append(std::to_string(j)));
      bucket.shapes = shapes;
      bucket.offsets = offsets;
      bucket.comm = comm.get();
      hook->run(bucket)->wait();
      const float* out = bucket.buffer.data<float>();
      run.outputs[r].emplace_back(out, out + total);
    }
    run.hooks[r] = hook;
  });
  return run;
}

std::vector<double> exactSum(int n, int t, size_t total) {
  std::vector<double> sum(total, 0.0);
  for (int r = 0; r < n; ++r) {
    auto g = gradientOf(r, t, total);
    for (size_t i = 0; i < total; ++i) sum[i] += g[i];
  }
  return sum;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

const std::vector<Shape> kShapes = {{8, 6}, {5}, {4, 3, 2}, {6, 9}};
constexpr size_t kTotal = 48 + 5 + 24 + 54;

// Gradients of the toy model on `ranks` ranks for `steps` steps of plain SGD, with an
// optional hook; returns rank 0's averaged gradients of every step and the final weights.
struct ToyRun {
  std::vector<std::vector<double>> grads;
  std::vector<double> weights;
};
ToyRun trainToy(int ranks, const HookFactory& make, int steps, size_t bucketBytes = 256) {
  auto comms = nativeRanks(ranks);
  ToyData data = makeToyData(16 * ranks);
  ToyRun out;
  runThreads(ranks, [&](int r) {
    NamedTensors p = makeToyParameters(21);
    ReducerOptions opts;
    opts.firstBucketCapBytes = bucketBytes;
    opts.bucketCapBytes = bucketBytes;
    Reducer reducer(p, comms(r), opts);
    if (make) reducer.registerCommHook(make());
    for (int s = 0; s < steps; ++s) {
      for (auto& [n, t] : p) t.zeroGrad();
      const int64_t lo = 8 * ((s * ranks + r) % (2 * ranks));
      toyLoss(p, data.rows(lo, lo + 8, false), data.rows(lo, lo + 8, true)).backward();
      reducer.finalize();
      if (r == 0) out.grads.push_back(flatGrads(p));
      autograd::NoGradGuard ng;
      for (auto& [n, t] : p) {
        float* w = t.data<float>();
        const float* g = t.grad().data<float>();
        for (int64_t i = 0; i < t.numel(); ++i) w[i] -= 0.5f * g[i];
      }
    }
    if (r == 0) out.weights = flatValues(p);
  });
  return out;
}

TEST(CommHook, AllreduceHookEqualsThePlainReducerBitForBit) {
  const ToyRun plain = trainToy(2, nullptr, 3);
  const ToyRun hooked = trainToy(
      2, [] { return cz::allreduceHook(); }, 3);
  ASSERT_EQ(plain.grads.size(), 3u);
  EXPECT_EQ(hooked.grads, plain.grads);
  EXPECT_EQ(hooked.weights, plain.weights);
}

TEST(CommHook, AllreduceHookMatchesAtFourRanks) {
  const ToyRun plain = trainToy(4, nullptr, 2);
  const ToyRun hooked = trainToy(
      4, [] { return cz::allreduceHook(); }, 2);
  for (size_t s = 0; s < plain.grads.size(); ++s)
    EXPECT_LT(maxRelDiff(hooked.grads[s], plain.grads[s]), 1e-6) << "step " << s;
}

TEST(CommHook, SixteenBitCastsStayWithinTheirPrecision) {
  const ToyRun plain = trainToy(2, nullptr, 1);
  const ToyRun fp16 = trainToy(
      2, [] { return cz::castHook(DType::F16); }, 1);
  const ToyRun bf16 = trainToy(
      2, [] { return cz::castHook(DType::BF16); }, 1);
  // Rounding each rank's value and the sum: a few units of 2^-11 (f16), 2^-8 (bf16) of the
  // largest gradient.
  const double fp16Err = maxRelDiff(fp16.grads[0], plain.grads[0]);
  const double bf16Err = maxRelDiff(bf16.grads[0], plain.grads[0]);
  EXPECT_LT(fp16Err, 2e-3);
  EXPECT_LT(bf16Err, 1.6e-2);
  EXPECT_GT(bf16Err, 0.0);  // the cast did happen
  EXPECT_GT(bf16Err, fp16Err);
}

TEST(CommHook, Fp16ScalingAvoidsOverflow) {
  // Four ranks of 30000 + 100 r sum to 120600, past f16's largest finite value (65504);
  // scaled by 1/4 before the cast they do not overflow.
  const HookRun run = runHook(
      4, [] { return cz::castHook(DType::F16); }, {{64}}, 1,
      [](int r, int, size_t n) { return std::vector<float>(n, 30000.0f + 100.0f * r); });
  for (float v : run.outputs[0][0]) EXPECT_NEAR(v, 120600.0, 120600.0 * 1e-3);
  EXPECT_EQ(run.hooks[0]->bytesSent(), 64u * 2u);
}

cz::PowerSgdOptions powerSgd(int rank, int64_t startStep = 0) {
  cz::PowerSgdOptions o;
  o.rank = rank;
  o.startStep = startStep;
  o.minCompressionRate = 0.0;  // compress every matrix, however small
  return o;
}

TEST(CommHook, PowerSgdWithFullRankIsExact) {
  // Rank 9 >= min(n, m) of every matrix (8x6, 4x6, 6x9): P Q^T is the exact sum.
  const HookRun run = runHook(
      3, [] { return cz::powerSgdHook(powerSgd(9)); }, kShapes, 3);
  for (int t = 0; t < 3; ++t) {
    const auto exact = exactSum(3, t, kTotal);
    for (int r = 0; r < 3; ++r) {
      EXPECT_LT(maxRelDiff(widen(run.outputs[r][t]), exact), 1e-5) << "rank " << r << " step " << t;
      EXPECT_EQ(run.outputs[r][t], run.outputs[0][t]);
    }
  }
  // Bytes per step: the vector (5) plain, P (8x6 + 4x4 + 6x6) and Q (6x6 + 6x4 + 9x6).
  EXPECT_EQ(run.hooks[0]->bytesSent(), 3u * 4u * (5u + 100u + 114u));
}

TEST(CommHook, PowerSgdWithLowRankApproximates) {
  // The same check fails at rank 1 (the approximation is not the sum), and the vector
  // still travels exactly.
  const HookRun run = runHook(
      2, [] { return cz::powerSgdHook(powerSgd(1)); }, kShapes, 1);
  const auto exact = exactSum(2, 0, kTotal);
  EXPECT_GT(maxRelDiff(widen(run.outputs[0][0]), exact), 0.05);
  for (size_t i = 48; i < 53; ++i) EXPECT_NEAR(run.outputs[0][0][i], exact[i], 1e-5);
}

TEST(CommHook, PowerSgdWarmUpStepsArePlainAllreduce) {
  const HookRun run = runHook(
      2, [] { return cz::powerSgdHook(powerSgd(1, 2)); }, kShapes, 3);
  for (int t = 0; t < 2; ++t)
    EXPECT_LT(maxRelDiff(widen(run.outputs[0][t]), exactSum(2, t, kTotal)), 1e-6);
  EXPECT_GT(maxRelDiff(widen(run.outputs[0][2]), exactSum(2, 2, kTotal)), 0.05);
}

// Error feedback loses nothing: the sum over steps of the averaged updates plus the
// ranks' mean residual equals the sum over steps of the ranks' mean gradient.
void expectErrorFeedbackConserves(const HookFactory& make, const std::string& residualName) {
  const int n = 2, steps = 5;
  const HookRun run = runHook(n, make, kShapes, steps);
  std::vector<double> lhs(kTotal, 0.0), rhs(kTotal, 0.0);
  for (int t = 0; t < steps; ++t) {
    const auto sum = exactSum(n, t, kTotal);
    for (size_t i = 0; i < kTotal; ++i) {
      lhs[i] += static_cast<double>(run.outputs[0][t][i]) / n;
      rhs[i] += sum[i] / n;
    }
  }
  double residualNorm = 0.0;
  for (int r = 0; r < n; ++r) {
    Tensor residual;
    for (const auto& [name, t] : run.hooks[r]->stateDict())
      if (name == residualName) residual = t;
    ASSERT_TRUE(residual.defined()) << residualName;
    const auto e = residual.toDoubleVector();
    ASSERT_EQ(e.size(), kTotal);
    for (size_t i = 0; i < kTotal; ++i) {
      lhs[i] += e[i] / n;
      residualNorm += std::abs(e[i]);
    }
  }
  EXPECT_GT(residualNorm, 1.0) << "nothing was left out: the check would be trivial";
  EXPECT_LT(maxRelDiff(lhs, rhs), 1e-5);
  // Without the residual the sums differ: compression did drop something.
  std::vector<double> updatesOnly(kTotal, 0.0);
  for (int t = 0; t < steps; ++t)
    for (size_t i = 0; i < kTotal; ++i) updatesOnly[i] += run.outputs[0][t][i] / n;
  EXPECT_GT(maxRelDiff(updatesOnly, rhs), 1e-2);
}

TEST(CommHook, PowerSgdErrorFeedbackConserves) {
  expectErrorFeedbackConserves([] { return cz::powerSgdHook(powerSgd(1)); },
                               "powersgd.bucket0.residual");
}

TEST(CommHook, TopKErrorFeedbackConserves) {
  expectErrorFeedbackConserves([] { return cz::topKHook({.fraction = 0.1}); },
                               "topk.bucket0.residual");
}

TEST(CommHook, TopKWithFractionOneIsExact) {
  const HookRun run = runHook(
      3, [] { return cz::topKHook({.fraction = 1.0}); }, kShapes, 2);
  for (int t = 0; t < 2; ++t)
    EXPECT_LT(maxRelDiff(widen(run.outputs[1][t]), exactSum(3, t, kTotal)), 1e-6);
}

TEST(CommHook, TopKSendsKElements) {
  // k = ceil(0.1 * 131) = 14 indices and values per step; the output has at most 2k
  // non-zeros, each the sum of what the ranks sent there.
  const HookRun run = runHook(
      2, [] { return cz::topKHook({.fraction = 0.1}); }, kShapes, 1);
  EXPECT_EQ(run.hooks[0]->bytesSent(), 14u * 8u);
  size_t nonZero = 0;
  for (float v : run.outputs[0][0]) nonZero += v != 0.0f;
  EXPECT_GE(nonZero, 14u);
  EXPECT_LE(nonZero, 28u);
}

TEST(CommHook, PowerSgdThroughTheReducerIsExactAtFullRank) {
  // The toy model's matrices are 16x12 and 5x16: rank 16 covers both, with one bucket per
  // parameter and the extras of the last bucket all-reduced beside the hook.
  const ToyRun plain = trainToy(2, nullptr, 3, 1);
  const ToyRun hooked = trainToy(
      2, [] { return cz::powerSgdHook(powerSgd(16)); }, 3, 1);
  for (size_t s = 0; s < plain.grads.size(); ++s)
    EXPECT_LT(maxRelDiff(hooked.grads[s], plain.grads[s]), 1e-5) << "step " << s;
  const ToyRun lossy = trainToy(
      2, [] { return cz::powerSgdHook(powerSgd(1)); }, 3, 1);
  EXPECT_GT(maxRelDiff(lossy.grads[0], plain.grads[0]), 1e-3);
}

TEST(CommHook, PowerSgdResumedFromItsStateEqualsTheUninterruptedRun) {
  const int ranks = 2, steps = 6, cut = 3;
  auto make = [] { return cz::powerSgdHook(powerSgd(2, 1)); };
  const ToyRun whole = trainToy(ranks, make, steps);

  // Three steps, the hook's state through a file, then a new reducer and a fresh hook for
  // the rest: as after a restart. Without the state the run differs.
  auto resumedRun = [&](bool restoreState) {
    auto comms = nativeRanks(ranks);
    ToyData data = makeToyData(16 * ranks);
    std::vector<double> resumed;
    const std::string dir =
        ::testing::TempDir() + "/comm_hook_resume_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    runThreads(ranks, [&](int r) {
      auto comm = comms(r);
      NamedTensors p = makeToyParameters(21);
      const std::string file = dir + "/rank" + std::to_string(r) + ".safetensors";
      ReducerOptions opts;
      opts.firstBucketCapBytes = 256;
      opts.bucketCapBytes = 256;
      auto train = [&](Reducer& reducer, int from, int to) {
        for (int s = from; s < to; ++s) {
          for (auto& [n, t] : p) t.zeroGrad();
          const int64_t lo = 8 * ((s * ranks + r) % (2 * ranks));
          toyLoss(p, data.rows(lo, lo + 8, false), data.rows(lo, lo + 8, true)).backward();
          reducer.finalize();
          autograd::NoGradGuard ng;
          for (auto& [n, t] : p) {
            float* w = t.data<float>();
            const float* g = t.grad().data<float>();
            for (int64_t i = 0; i < t.numel(); ++i) w[i] -= 0.5f * g[i];
          }
        }
      };
      {
        Reducer reducer(p, comm, opts);
        auto hook = make();
        reducer.registerCommHook(hook);
        train(reducer, 0, cut);
        checkpoint::saveSafetensors(file, hook->stateDict());
      }
      Reducer reducer(p, comm, opts);
      auto hook = make();
      if (restoreState) hook->loadStateDict(checkpoint::loadSafetensors(file).tensors);
      reducer.registerCommHook(hook);
      train(reducer, cut, steps);
      if (r == 0) resumed = flatValues(p);
    });
    std::filesystem::remove_all(dir);
    return resumed;
  };
  EXPECT_EQ(resumedRun(true), whole.weights);
  EXPECT_GT(maxRelDiff(resumedRun(false), whole.weights), 1e-6);
}

TEST(CommHook, BadSpecsAreClearErrors) {
  EXPECT_EQ(cz::parseCompressSpec("powersgd:4").rank, 4);
  EXPECT_DOUBLE_EQ(cz::parseCompressSpec("topk:0.01").fraction, 0.01);
  EXPECT_EQ(cz::parseCompressSpec("bf16").method, "bf16");
  const std::pair<const char*, const char*> bad[] = {
      {"powersgd:0", "RANK of powersgd:RANK must be an integer >= 1, got '0'"},
      {"powersgd", "must be an integer >= 1, got ''"},
      {"powersgd:2x", "got '2x'"},
      {"topk:2", "FRACTION of topk:FRACTION must be a number in (0, 1], got '2'"},
      {"topk:0", "got '0'"},
      {"topk:nan", "got 'nan'"},
      {"fp16:3", "fp16 takes no argument"},
      {"zip", "unknown compression 'zip'"},
  };
  for (const auto& [spec, expected] : bad) {
    try {
      cz::parseCompressSpec(spec);
      ADD_FAILURE() << spec << " was accepted";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(std::string("parseCompressSpec ") + spec), std::string::npos) << message;
      EXPECT_NE(message.find(expected), std::string::npos) << message;
    }
  }
}

TEST(CommHook, CompressionRejectsF64BucketsAndBadState) {
  auto comms = nativeRanks(1);
  auto comm = comms(0);
  GradBucket bucket;
  bucket.count = 1;
  bucket.buffer = Tensor::zeros({4}, DType::F64);
  bucket.shapes = {{4}};
  bucket.offsets = {0};
  bucket.names = {"w"};
  bucket.comm = comm.get();
  for (auto hook :
       {cz::castHook(DType::F16), cz::powerSgdHook(powerSgd(1)), cz::topKHook({.fraction = 0.5})}) {
    try {
      hook->run(bucket);
      ADD_FAILURE() << hook->name() << " accepted f64";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("only f32 is compressed"), std::string::npos)
          << e.what();
    }
  }
  auto hook = cz::powerSgdHook(powerSgd(1));
  EXPECT_THROW(hook->loadStateDict({{"topk.bucket0.residual", Tensor::zeros({4})}}),
               InvalidArgument);
  EXPECT_THROW(hook->loadStateDict({}), InvalidArgument);  // no step count
}

}  // namespace
}  // namespace kolo::parallel
