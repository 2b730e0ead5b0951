// Stale-synchronous parallel keeps its bound: three workers of different speeds (worker 0
// sleeps every step) record when each step starts and when each push leaves; afterwards the
// test checks that whenever worker w started step k, every other worker had already sent its
// push number k - S (so no worker ran more than S updates ahead of the slowest). The same run
// in async mode, with worker 0 held back until the others are S + 2 steps ahead, breaks that
// condition, which shows the check can see a violation. Workers that overlap their exchange
// with the next step (WorkerExchange with two replicas) compute one step further ahead, but
// their pushes keep the bound: push k leaves only once every other worker sent push k - S - 1.
#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>

#include "ps_harness.h"

namespace kolo::parallel::ps::testing {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kWorkers = 3;
constexpr int kSteps = 30;
constexpr int64_t kBatch = 16;

struct Trace {
  std::vector<Clock::time_point> started;   // [k]: step k began (its parameters had arrived)
  std::vector<Clock::time_point> sent;      // [k]: push k was handed to the exchange
  std::vector<Clock::time_point> returned;  // [k]: the exchange call of push k returned
};

struct JobTrace {
  std::vector<Trace> traces;
  std::vector<ServerStats> stats;
};

std::unique_ptr<optim::Optimizer> sgd(const NamedTensors& params) {
  return std::make_unique<optim::Sgd>(params, optim::SgdOptions{.lr = 0.01});
}

/// With `holdSlowWorker`, worker 0 waits after its first push until every other worker has
/// started step S + 2, so async mode must show a violation however loaded the machine is
/// (under ssp that wait could never end).
JobTrace runJob(Mode mode, int staleness, bool holdSlowWorker = false, bool overlapped = false) {
  const Samples data = firstSamples(kWorkers * kSteps * kBatch);
  const Placement placement = placeParameters(makeMlp()->namedParameters(), 2, 1 << 20);
  ServerThreads job(2, kWorkers, mode, staleness, placement, sgd);
  JobTrace run;
  run.traces.resize(kWorkers);
  std::mutex mutex;
  std::condition_variable progressed;
  std::vector<int> stepsStarted(kWorkers, 0);
  bool heldLongEnough = true;
  parallel::testing::runThreads(kWorkers, [&](int w) {
    Trace& trace = run.traces[static_cast<size_t>(w)];
    std::vector<std::shared_ptr<nn::Module>> models = {makeMlp()};
    std::vector<NamedTensors> replicas = {models[0]->namedParameters()};
    if (overlapped) {
      models.push_back(makeMlp());
      replicas.push_back(models[1]->namedParameters());
    }
    ServerGroup group({ClientRole::Worker, w, Compression::None, kToken, std::chrono::seconds(60)},
                      placement, job.addresses());
    WorkerExchange exchange(group, replicas);
    exchange.pull();
    for (int k = 0; k < kSteps; ++k) {
      if (holdSlowWorker && w == 0 && k == 1) {
        std::unique_lock<std::mutex> lock(mutex);
        heldLongEnough = progressed.wait_for(lock, std::chrono::seconds(60), [&] {
          for (int j = 1; j < kWorkers; ++j)
            if (stepsStarted[static_cast<size_t>(j)] < staleness + 3) return false;
          return true;
        });
      }
      trace.started.push_back(Clock::now());
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++stepsStarted[static_cast<size_t>(w)];
      }
      progressed.notify_all();
      const int64_t begin = (k * kWorkers + w) * kBatch;
      lossAndGradients(*models[static_cast<size_t>(exchange.current())], data, begin,
                       begin + kBatch);
      if (w == 0) std::this_thread::sleep_for(std::chrono::milliseconds(6));
      trace.sent.push_back(Clock::now());
      exchange.pushAndSwap();
      trace.returned.push_back(Clock::now());
    }
    exchange.settle();
    group.leave();
  });
  ServerGroup chief({ClientRole::Chief, 0, Compression::None, kToken, std::chrono::seconds(60)},
                    placement, job.addresses());
  run.stats = chief.stats();
  EXPECT_TRUE(heldLongEnough) << "the other workers never got S + 2 steps ahead of worker 0";
  return run;
}

/// How many (w, k, j) had worker w start step k (overlapped: return from the exchange call of
/// push k, which waits for the reply to push k - 1) before worker j sent push k - S - 1.
int violations(const JobTrace& run, int staleness, bool overlapped = false) {
  int count = 0;
  for (int w = 0; w < kWorkers; ++w) {
    for (int k = staleness + 1; k < kSteps; ++k) {
      for (int j = 0; j < kWorkers; ++j) {
        if (j == w) continue;
        const auto& sent = run.traces[static_cast<size_t>(j)].sent;
        const Trace& mine = run.traces[static_cast<size_t>(w)];
        const auto& gate = overlapped ? mine.returned : mine.started;
        count += gate[static_cast<size_t>(k)] < sent[static_cast<size_t>(k - staleness - 1)];
      }
    }
  }
  return count;
}

class SspBound : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { KOLO_SKIP_WITHOUT_FASHION_MNIST(); }
};

TEST_P(SspBound, NoWorkerRunsMoreThanSAhead) {
  const int staleness = GetParam();
  const JobTrace run = runJob(Mode::Ssp, staleness);
  EXPECT_EQ(violations(run, staleness), 0);
  for (const ServerStats& s : run.stats) {
    EXPECT_LE(s.leadMax, staleness);
    EXPECT_EQ(s.updates, kWorkers * kSteps);
    // While worker w computes step k, each other worker is at least at k - S and may go on
    // to its push k + S: a gradient is at most (W - 1)(2S + 1) updates old.
    EXPECT_LE(s.stalenessMax, (kWorkers - 1) * (2 * staleness + 1));
  }
}

TEST_P(SspBound, OverlappedWorkersPushNoMoreThanSAhead) {
  const int staleness = GetParam();
  const JobTrace run = runJob(Mode::Ssp, staleness, false, /*overlapped=*/true);
  EXPECT_EQ(violations(run, staleness, /*overlapped=*/true), 0);
  for (const ServerStats& s : run.stats) {
    EXPECT_LE(s.leadMax, staleness);
    EXPECT_EQ(s.updates, kWorkers * kSteps);
    // A step computes on the reply to the push before the previous one: while it computes,
    // each other worker may apply up to 2S + 2 pushes, and the worker itself one.
    EXPECT_LE(s.stalenessMax, (kWorkers - 1) * (2 * staleness + 2) + 1);
  }
}

INSTANTIATE_TEST_SUITE_P(Ps, SspBound, ::testing::Values(0, 1, 2));

TEST(SspBoundControl, AsyncRunsAheadOfTheSlowWorker) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const JobTrace run = runJob(Mode::Async, 2, /*holdSlowWorker=*/true);
  EXPECT_GT(violations(run, 2), 0);
  for (const ServerStats& s : run.stats) EXPECT_EQ(s.leadMax, 0);  // not measured in async
}

}  // namespace
}  // namespace kolo::parallel::ps::testing
