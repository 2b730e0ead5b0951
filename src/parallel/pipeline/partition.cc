// Choosing the pipeline's split points: per-layer costs measured by timing each layer's
// forward and backward, and the contiguous partition whose slowest stage is fastest.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "kolo/autograd.h"
#include "kolo/error.h"
#include "kolo/parallel/pipeline.h"

namespace kolo::parallel {

std::vector<int> partitionByCost(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  KOLO_REQUIRE(stages >= 1, "partitionByCost: stages must be at least 1, got ", stages);
  KOLO_REQUIRE(n >= stages, "partitionByCost: ", n, " layers cannot fill ", stages, " stages");
  for (int i = 0; i < n; ++i)
    KOLO_REQUIRE(std::isfinite(costs[static_cast<size_t>(i)]) && costs[static_cast<size_t>(i)] >= 0.0,
                 "partitionByCost: cost of layer ", i, " is ", costs[static_cast<size_t>(i)]);
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0.0);
  for (int i = 0; i < n; ++i) prefix[static_cast<size_t>(i) + 1] = prefix[static_cast<size_t>(i)] + costs[static_cast<size_t>(i)];
  auto range = [&](int a, int b) { return prefix[static_cast<size_t>(b)] - prefix[static_cast<size_t>(a)]; };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[k][j]: the smallest slowest-stage cost of layers [0, j) in k stages; cut[k][j]: where
  // the last of those stages begins.
  std::vector<std::vector<double>> best(static_cast<size_t>(stages) + 1,
                                        std::vector<double>(static_cast<size_t>(n) + 1, kInf));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<size_t>(n) + 1, 0));
  best[0][0] = 0.0;
  for (int k = 1; k <= stages; ++k) {
    for (int j = k; j <= n - (stages - k); ++j) {
      for (int i = k - 1; i < j; ++i) {
        const double slowest = std::max(best[static_cast<size_t>(k) - 1][static_cast<size_t>(i)], range(i, j));
        if (slowest < best[static_cast<size_t>(k)][static_cast<size_t>(j)]) {
          best[static_cast<size_t>(k)][static_cast<size_t>(j)] = slowest;
          cut[static_cast<size_t>(k)][static_cast<size_t>(j)] = i;
        }
      }
    }
  }
  std::vector<int> splits(static_cast<size_t>(stages) - 1);
  int j = n;
  for (int k = stages; k > 1; --k) {
    j = cut[static_cast<size_t>(k)][static_cast<size_t>(j)];
    splits[static_cast<size_t>(k) - 2] = j;
  }
  return splits;
}

double slowestStageCost(const std::vector<double>& costs, const std::vector<int>& splits) {
  const int n = static_cast<int>(costs.size());
  double slowest = 0.0;
  int begin = 0;
  for (size_t s = 0; s <= splits.size(); ++s) {
    const int end = s < splits.size() ? splits[s] : n;
    KOLO_REQUIRE(end > begin && end <= n, "slowestStageCost: split ", end, " does not follow ", begin,
                 " inside (0, ", n, ")");
    double sum = 0.0;
    for (int i = begin; i < end; ++i) sum += costs[static_cast<size_t>(i)];
    slowest = std::max(slowest, sum);
    begin = end;
  }
  return slowest;
}

std::vector<double> measureLayerCosts(nn::Sequential& model, const Tensor& input, int repeats) {
  KOLO_REQUIRE(repeats >= 1, "measureLayerCosts: repeats must be at least 1, got ", repeats);
  using Clock = std::chrono::steady_clock;
  std::vector<double> costs;
  Tensor x = input;
  for (size_t i = 0; i < model.size(); ++i) {
    nn::Module& layer = model.at(i);
    std::vector<double> samples;
    Tensor next;
    for (int r = 0; r <= repeats; ++r) {  // r == 0 warms up
      Tensor in = x.detach();
      if (in.dtype() == DType::F32 || in.dtype() == DType::F64) in.setRequiresGrad(true);
      const auto start = Clock::now();
      Tensor out = layer.forward(in);
      if (out.requiresGrad()) out.backward(Tensor::ones(out.shape(), out.dtype()));
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (r > 0) samples.push_back(seconds);
      next = out.detach();
    }
    std::sort(samples.begin(), samples.end());
    costs.push_back(samples[samples.size() / 2]);
    x = next;
  }
  model.zeroGrad();
  return costs;
}

std::vector<int> measuredSplit(comm::Communicator& comm, nn::Sequential& model, const Tensor& input,
                               int repeats, std::vector<double>* costs, int stages) {
  if (stages <= 0) stages = comm.size();
  const int n = static_cast<int>(model.size());
  KOLO_REQUIRE(n >= stages, "pipeline: the model has ", n, " layers, too few for ", stages, " stages");
  std::vector<double> measured(static_cast<size_t>(n), 0.0);
  if (comm.rank() == 0) measured = measureLayerCosts(model, input, repeats);
  if (comm.size() > 1) comm.broadcast(measured.data(), measured.size(), DType::F64, 0);
  if (costs) *costs = measured;
  // Every rank partitions the same numbers with the same pure function.
  return partitionByCost(measured, stages);
}

}  // namespace kolo::parallel
