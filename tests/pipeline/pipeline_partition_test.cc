// The pipeline's pure parts: the schedules' action lists (every micro-batch's forward
// before its backward, the in-flight bound of each schedule) and the cost partitioner
// against brute force on deliberately uneven layers.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <limits>

#include "kolo/parallel/pipeline.h"

namespace kolo::parallel {
namespace {

int peakInFlight(const std::vector<PipelineAction>& actions) {
  int held = 0, peak = 0;
  for (const PipelineAction& a : actions) {
    held += a.forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

TEST(PipelineSchedules, EveryMicroBatchRunsForwardThenBackwardOnce) {
  for (PipelineSchedule schedule : {PipelineSchedule::GPipe, PipelineSchedule::OneFOneB}) {
    for (int stages : {1, 2, 3, 4, 8}) {
      for (int micro : {1, 2, 4, 7, 8, 16}) {
        for (int stage = 0; stage < stages; ++stage) {
          const auto actions = pipelineActions(schedule, stages, stage, micro);
          ASSERT_EQ(actions.size(), static_cast<size_t>(2 * micro));
          std::vector<int> forwardAt(static_cast<size_t>(micro), -1), backwardAt(static_cast<size_t>(micro), -1);
          int nextF = 0, nextB = 0;
          for (size_t i = 0; i < actions.size(); ++i) {
            const PipelineAction& a = actions[i];
            // Both directions walk micro-batches in ascending order.
            EXPECT_EQ(a.microBatch, a.forward ? nextF++ : nextB++);
            (a.forward ? forwardAt : backwardAt)[static_cast<size_t>(a.microBatch)] = static_cast<int>(i);
          }
          for (int m = 0; m < micro; ++m) EXPECT_LT(forwardAt[static_cast<size_t>(m)], backwardAt[static_cast<size_t>(m)]);
          const int peak = peakInFlight(actions);
          if (schedule == PipelineSchedule::GPipe) {
            EXPECT_EQ(peak, micro);
          } else {
            EXPECT_EQ(peak, std::min(stages - stage, micro)) << "P=" << stages << " s=" << stage << " M=" << micro;
          }
        }
      }
    }
  }
  EXPECT_STREQ(pipelineScheduleName(parsePipelineSchedule("1f1b")), "1f1b");
  EXPECT_THROW(parsePipelineSchedule("zero-bubble"), InvalidArgument);
  EXPECT_THROW(pipelineActions(PipelineSchedule::GPipe, 2, 2, 4), InvalidArgument);
}

// Every placement of P - 1 cuts among n - 1 gaps.
double bruteForceSlowest(const std::vector<double>& costs, int stages) {
  const int n = static_cast<int>(costs.size());
  double best = std::numeric_limits<double>::infinity();
  std::vector<int> splits;
  std::function<void(int)> place = [&](int from) {
    if (static_cast<int>(splits.size()) == stages - 1) {
      best = std::min(best, slowestStageCost(costs, splits));
      return;
    }
    for (int s = from; s < n; ++s) {
      splits.push_back(s);
      place(s + 1);
      splits.pop_back();
    }
  };
  place(1);
  return best;
}

TEST(PipelinePartition, SlowestStageWithinTenPercentOfBruteForce) {
  Generator gen(5);
  int cases = 0;
  for (int n = 2; n <= 12; ++n) {
    for (int stages = 1; stages <= std::min(n, 5); ++stages) {
      for (int trial = 0; trial < 6; ++trial) {
        // Deliberately uneven: most layers cheap, a few 10-100x heavier.
        std::vector<double> costs;
        for (int i = 0; i < n; ++i) {
          const double u = gen.uniform();
          costs.push_back(u < 0.25 ? 10.0 + 90.0 * gen.uniform() : 0.5 + gen.uniform());
        }
        const std::vector<int> splits = partitionByCost(costs, stages);
        ASSERT_EQ(splits.size(), static_cast<size_t>(stages - 1));
        const double chosen = slowestStageCost(costs, splits);
        const double best = bruteForceSlowest(costs, stages);
        EXPECT_LE(chosen, best * 1.10) << "n=" << n << " P=" << stages;
        EXPECT_GE(chosen, best);  // brute force saw every split
        EXPECT_NEAR(chosen, best, 1e-12 * best) << "the dynamic programme is exact";
        ++cases;
      }
    }
  }
  EXPECT_GT(cases, 250);
}

TEST(PipelinePartition, KnownCases) {
  EXPECT_EQ(partitionByCost({1, 1, 1, 1}, 2), (std::vector<int>{2}));
  EXPECT_EQ(partitionByCost({8, 1, 1, 1, 1, 1, 1, 1, 1}, 2), (std::vector<int>{1}));
  EXPECT_EQ(partitionByCost({1, 1, 1, 9, 1, 1}, 3), (std::vector<int>{3, 4}));
  EXPECT_EQ(partitionByCost({5, 5, 5}, 3), (std::vector<int>{1, 2}));
  EXPECT_TRUE(partitionByCost({3}, 1).empty());
  EXPECT_THROW(partitionByCost({1, 2}, 3), InvalidArgument);
  EXPECT_THROW(partitionByCost({1, -2}, 1), InvalidArgument);
  EXPECT_THROW(slowestStageCost({1, 2, 3}, {2, 2}), InvalidArgument);
}

}  // namespace
}  // namespace kolo::parallel
