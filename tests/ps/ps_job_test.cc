// Parameter-server jobs as real processes under `kolo run --ps P --workers W`: a worker
// SIGKILLed mid-training loses its unit to the others and the job still finishes every unit,
// naming the lost worker in its metrics; a server SIGKILLed stops the job with an error that
// names it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "launcher/process_helpers.h"
#include "support/fashion_mnist.h"

namespace kolo::testing {
namespace {

const std::string kKolo = KOLO_BINARY_DIR "/src/cli/kolo";

class PsJob : public TempDirTest {
 protected:
  void SetUp() override {
    KOLO_SKIP_WITHOUT_FASHION_MNIST();
    TempDirTest::SetUp();
  }

  /// Starts a job training `epochs` epochs of the first 12,000 images. Momentum 0.5: with
  /// three asynchronous workers the staleness adds momentum of its own, and 0.9 on top of it
  /// does not converge in this many updates (docs/parameter_server.md).
  Child start(int servers, int workers, const std::string& mode, int epochs) {
    metrics_ = dir_ + "/metrics.jsonl";
    return spawnChild({kKolo, "run", "--ps", std::to_string(servers), "--workers",
                       std::to_string(workers), "--timeout", "60", "--", kKolo, "train",
                       "--strategy", "parameter-server", "--ps-mode", mode, "--model", "mlp",
                       "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.5", "--batch",
                       "64", "--epochs",
                       std::to_string(epochs), "--train-limit", "12000", "--ps-unit-batches",
                       "4", "--metrics", metrics_, "--quiet"},
                      cleanEnvironment());
  }

  /// Waits until the chief wrote its first epoch's line, then SIGKILLs rank `rank`.
  void killAfterFirstEpoch(const Child& job, int rank) {
    ASSERT_TRUE(waitFor([&] { return readFile(metrics_).find('\n') != std::string::npos; },
                        std::chrono::seconds(120)))
        << "no epoch finished";
    pid_t victim = -1;
    for (pid_t child : childrenOf(job.pid))
      if (rankOf(child) == rank) victim = child;
    ASSERT_GT(victim, 0) << "rank " << rank << " not found";
    ASSERT_EQ(::kill(victim, SIGKILL), 0);
  }

  std::vector<nlohmann::json> metricLines() const {
    std::vector<nlohmann::json> lines;
    for (const std::string& line : splitLines(readFile(metrics_)))
      lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  std::string metrics_;
};

TEST_F(PsJob, KilledWorkerLosesItsUnitsToTheOthers) {
  Child job = start(1, 3, "async", 3);
  killAfterFirstEpoch(job, 3);  // ranks: 0 server, 1 chief, 2..4 workers 0..2
  const Result result = collect(job);
  ASSERT_EQ(result.exitCode(), 0) << result.out << result.err;
  EXPECT_NE(result.err.find("worker 1 (rank 3"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("the job goes on without it"), std::string::npos) << result.err;
  const std::vector<nlohmann::json> lines = metricLines();
  ASSERT_EQ(lines.size(), 4u);
  const nlohmann::json& last = lines.back();
  EXPECT_TRUE(last["final"].get<bool>());
  EXPECT_EQ(last["workers_alive"], 2);
  ASSERT_EQ(last["workers_lost"].size(), 1u);
  EXPECT_EQ(last["workers_lost"][0]["worker"], 1);
  // 12,000 samples a epoch in units of 4 x 64: 47 units, 3 epochs; every one done.
  int64_t units = 0;
  for (const auto& n : last["units_done"]) units += n.get<int64_t>();
  EXPECT_EQ(units, 3 * 47);
  EXPECT_GT(last["test_accuracy"].get<double>(), 0.7);
  EXPECT_EQ(last["ps_mode"], "async");
  for (const char* key : {"updates", "staleness_max", "staleness_mean", "pushes_per_s",
                          "bytes_per_s"})
    EXPECT_TRUE(last.contains(key)) << key;
}

TEST_F(PsJob, KilledServerStopsTheJobNamingIt) {
  Child job = start(2, 2, "sync", 20);
  killAfterFirstEpoch(job, 1);  // parameter server 1
  const Result result = collect(job);
  EXPECT_NE(result.exitCode(), 0);
  EXPECT_NE(result.err.find("parameter server 1"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace kolo::testing
