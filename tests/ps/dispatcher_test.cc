// The chief's unit dispatcher over loopback sockets: units are handed out in order, a faster
// worker takes more of them, every unit is done exactly once, a worker that disconnects
// holding a unit loses it to the others and is named, and a pause between epochs holds the
// next epoch back until it is released.
#include <gtest/gtest.h>

#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "parallel/ps/wire.h"

namespace kolo::parallel::ps {
namespace {

constexpr char kToken[] = "dispatcher-test";

DispatchOptions options(int workers, int64_t epochs) {
  DispatchOptions o;
  o.workers = workers;
  o.samplesPerEpoch = 1000;
  o.unitSamples = 100;  // 10 units an epoch
  o.epochs = epochs;
  o.token = kToken;
  o.timeout = std::chrono::seconds(30);
  return o;
}

std::string address(const UnitDispatcher& d) { return "127.0.0.1:" + std::to_string(d.port()); }

/// Every unit one worker (index 0) takes from `dispatcher`, in order, until the job is over.
std::vector<Unit> unitsOfOneWorker(UnitDispatcher& dispatcher) {
  std::vector<Unit> units;
  std::thread worker([&] {
    UnitClient client(address(dispatcher), 0, kToken, std::chrono::seconds(30));
    UnitReport report;
    while (auto unit = client.next(report, nullptr)) {
      units.push_back(*unit);
      report = {unit->id, 1.0, 1};
    }
  });
  dispatcher.waitWorkersFinished();
  worker.join();
  return units;
}

TEST(UnitDispatcher, FasterWorkersTakeMoreAndEveryUnitIsDoneOnce) {
  UnitDispatcher dispatcher(options(2, 2));
  std::mutex mutex;
  std::multiset<std::pair<int64_t, int64_t>> seen;  // (epoch, begin)
  std::vector<std::thread> workers;
  for (int w = 0; w < 2; ++w) {
    workers.emplace_back([&, w] {
      UnitClient client(address(dispatcher), w, kToken, std::chrono::seconds(30));
      UnitReport report;
      while (auto unit = client.next(report, nullptr)) {
        {
          std::lock_guard lock(mutex);
          seen.insert({unit->epoch, unit->begin});
        }
        EXPECT_EQ(unit->end - unit->begin, 100);
        std::this_thread::sleep_for(std::chrono::milliseconds(w == 0 ? 20 : 2));
        report = {unit->id, 1.0, 1};
      }
    });
  }
  EXPECT_EQ(dispatcher.waitEpoch(0).batches, 10);
  EXPECT_EQ(dispatcher.waitEpoch(1).batches, 10);
  dispatcher.waitWorkersFinished();
  for (auto& t : workers) t.join();
  EXPECT_EQ(seen.size(), 20u);
  for (const auto& unit : seen) EXPECT_EQ(seen.count(unit), 1u);
  const std::vector<int64_t> done = dispatcher.unitsDone();
  EXPECT_EQ(done[0] + done[1], 20);
  EXPECT_GT(done[1], done[0]);
  EXPECT_TRUE(dispatcher.lost().empty());
  EXPECT_EQ(dispatcher.workersAlive(), 2);
}

// A run that ends mid-epoch (its step count): the last epoch hands out only its first
// lastEpochSamples positions, its last unit cut to them, and the job ends after it.
TEST(UnitDispatcher, AShortLastEpochHandsOutOnlyItsSamples) {
  DispatchOptions o = options(1, 2);
  o.lastEpochSamples = 250;  // units [0, 100), [100, 200), [200, 250) of epoch 1
  UnitDispatcher dispatcher(o);
  const std::vector<Unit> units = unitsOfOneWorker(dispatcher);
  EXPECT_EQ(dispatcher.waitEpoch(0).batches, 10);
  EXPECT_EQ(dispatcher.waitEpoch(1).batches, 3);
  ASSERT_EQ(units.size(), 13u);
  EXPECT_EQ(units[12].epoch, 1);
  EXPECT_EQ(units[12].begin, 200);
  EXPECT_EQ(units[12].end, 250);
  EXPECT_EQ(dispatcher.unitsDone()[0], 13);
  o.lastEpochSamples = 1001;
  EXPECT_THROW(UnitDispatcher{o}, InvalidArgument);
}

// Units two alike (two sync workers): a short last epoch of 260 samples is one cycle of two
// whole units and then two equal units of what is left, 30 samples each, so that two workers
// taking one unit each per cycle hold the same number of samples; a count that does not
// divide the epoch is refused.
TEST(UnitDispatcher, UnitsAlikeCutWhatIsLeftIntoEqualUnits) {
  DispatchOptions o = options(1, 2);
  o.unitsAlike = 2;
  o.lastEpochSamples = 260;
  UnitDispatcher dispatcher(o);
  const std::vector<Unit> units = unitsOfOneWorker(dispatcher);
  ASSERT_EQ(units.size(), 14u);  // 10 of 100, then 100, 100, 30, 30
  const std::vector<std::pair<int64_t, int64_t>> last = {{0, 100}, {100, 200}, {200, 230}, {230, 260}};
  for (size_t i = 0; i < last.size(); ++i) {
    EXPECT_EQ(units[10 + i].epoch, 1);
    EXPECT_EQ(std::make_pair(units[10 + i].begin, units[10 + i].end), last[i]) << "unit " << 10 + i;
  }
  o.unitsAlike = 3;  // 1000 samples do not split into 3 alike
  EXPECT_THROW(UnitDispatcher{o}, InvalidArgument);
}

TEST(UnitDispatcher, AWorkerWhoseHeartbeatsStopIsLostAndItsUnitGoesToTheOthers) {
  DispatchOptions o = options(2, 1);
  o.heartbeat = std::chrono::milliseconds(300);
  std::mutex mutex;
  std::vector<int> told;
  o.onLost = [&](int worker) {
    std::lock_guard lock(mutex);
    told.push_back(worker);
  };
  UnitDispatcher dispatcher(o);
  // Worker 1 holds a unit with its connection open; its heartbeat connection says nothing
  // after the hello (a stopped process).
  UnitClient silent(address(dispatcher), 1, kToken, std::chrono::seconds(30));
  const int64_t held = silent.next({}, nullptr)->id;
  detail::Socket beats =
      detail::connectTo(address(dispatcher), detail::deadlineAfter(std::chrono::seconds(30)),
                        "the chief");
  detail::hello(beats, 1, detail::kHeartbeatHello, kToken,
                detail::deadlineAfter(std::chrono::seconds(30)));
  // Worker 0 beats (every 50 ms) and takes every unit, the lost one included.
  UnitClient worker(address(dispatcher), 0, kToken, std::chrono::seconds(30),
                    std::chrono::milliseconds(200));
  std::set<int64_t> ids;
  UnitReport report;
  while (auto unit = worker.next(report, nullptr)) {
    ids.insert(unit->id);
    report = {unit->id, 0.5, 1};
  }
  EXPECT_EQ(ids.size(), 10u);
  EXPECT_TRUE(ids.count(held));
  const std::vector<LostWorker> lost = dispatcher.lost();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].index, 1);
  EXPECT_EQ(lost[0].unit, held);
  EXPECT_TRUE(lost[0].heartbeat);
  EXPECT_EQ(dispatcher.workersAlive(), 1);
  // The chief is told from the watcher thread once the unit is already back in the queue, so
  // worker 0 may finish before the call: wait for it (bounded).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (;;) {
    {
      std::lock_guard lock(mutex);
      if (!told.empty() || std::chrono::steady_clock::now() > until) {
        EXPECT_EQ(told, std::vector<int>{1});
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Its connection was closed: it learns so when it asks again.
  EXPECT_THROW(silent.next({held, 1.0, 1}, nullptr), Error);
}

TEST(UnitDispatcher, AWorkerBusyInALongStepKeepsBeating) {
  // The heartbeats come from their own thread: a worker computing for six heartbeat periods
  // without a word on its unit connection is not lost.
  DispatchOptions o = options(1, 1);
  o.heartbeat = std::chrono::milliseconds(500);
  UnitDispatcher dispatcher(o);
  UnitClient worker(address(dispatcher), 0, kToken, std::chrono::seconds(30), o.heartbeat);
  UnitReport report;
  bool first = true;
  while (auto unit = worker.next(report, nullptr)) {
    if (first) {  // the long step: the main thread busy, taking no lock of the client's
      const auto until = std::chrono::steady_clock::now() + 6 * o.heartbeat;
      volatile double sink = 0.0;
      while (std::chrono::steady_clock::now() < until)
        for (int i = 0; i < 1000; ++i) sink = sink + i * 1e-9;
      first = false;
    }
    report = {unit->id, 0.5, 1};
  }
  EXPECT_TRUE(dispatcher.lost().empty());
  EXPECT_EQ(dispatcher.workersAlive(), 1);
  EXPECT_EQ(dispatcher.unitsDone(), std::vector<int64_t>{10});
}

TEST(UnitDispatcher, ALostWorkersUnitGoesToTheOthers) {
  UnitDispatcher dispatcher(options(2, 1));
  int64_t held = -1;
  {
    UnitClient quitter(address(dispatcher), 1, kToken, std::chrono::seconds(30));
    held = quitter.next({}, nullptr)->id;
  }  // closes its connection holding the unit
  UnitClient worker(address(dispatcher), 0, kToken, std::chrono::seconds(30));
  std::set<int64_t> ids;
  UnitReport report;
  while (auto unit = worker.next(report, nullptr)) {
    ids.insert(unit->id);
    report = {unit->id, 0.5, 1};
  }
  EXPECT_EQ(ids.size(), 10u);  // the lost unit included
  EXPECT_TRUE(ids.count(held));
  EXPECT_EQ(dispatcher.waitEpoch(0).batches, 10);
  ASSERT_EQ(dispatcher.lost().size(), 1u);
  EXPECT_EQ(dispatcher.lost()[0].index, 1);
  EXPECT_EQ(dispatcher.lost()[0].unit, held);
  EXPECT_EQ(dispatcher.workersAlive(), 1);
}

TEST(UnitDispatcher, PausesBetweenEpochsUntilReleased) {
  DispatchOptions o = options(1, 2);
  o.pauseBetweenEpochs = true;
  UnitDispatcher dispatcher(o);
  std::atomic<int64_t> secondEpochUnits{0};
  std::atomic<bool> released{false};
  std::thread worker([&] {
    UnitClient client(address(dispatcher), 0, kToken, std::chrono::seconds(30));
    UnitReport report;
    while (auto unit = client.next(report, nullptr)) {
      if (unit->epoch == 1) {
        EXPECT_TRUE(released.load()) << "a unit of epoch 2 before the release";
        ++secondEpochUnits;
      }
      report = {unit->id, 0.0, 1};
    }
  });
  dispatcher.waitEpoch(0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(secondEpochUnits.load(), 0);
  released = true;
  dispatcher.releaseEpoch(1);
  dispatcher.waitEpoch(1);
  dispatcher.waitWorkersFinished();
  worker.join();
  EXPECT_EQ(secondEpochUnits.load(), 10);
}

TEST(UnitDispatcher, RefusesAWrongToken) {
  UnitDispatcher dispatcher(options(1, 1));
  EXPECT_THROW(UnitClient(address(dispatcher), 0, "not-the-token", std::chrono::seconds(5)),
               PeerError);
}

}  // namespace
}  // namespace kolo::parallel::ps
