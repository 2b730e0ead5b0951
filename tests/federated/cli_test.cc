// `kolo train --strategy federated` end to end: a job of real processes under kolo run whose
// client host dies (the server leaves its clients out and the job completes), the metrics
// lines, secure aggregation with DP in one process, bad flags named and a missing --init file
// refused as an input-file error.
#include <gtest/gtest.h>

#include <cstdio>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cli/run_kolo.h"
#include "kolo/safetensors.h"
#include "support/fashion_mnist.h"

namespace {

std::vector<nlohmann::json> readLines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::string tempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("kolo-fed-" + std::to_string(::getpid()) + "-" + name))
      .string();
}

TEST(FederatedCli, DeadClientHostIsLeftOutAndTheJobCompletes) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::string metrics = tempPath("dead.jsonl");
  const auto result =
      kolo::testing::runKolo("run -n 3 --tolerate-failures -- " + std::string(KOLO_BINARY_DIR) +
                             "/src/cli/kolo train --strategy federated --train-limit 1200 "
                             "--clients 6 --clients-per-round 6 "
                             "--rounds 3 --local-batch 20 --lr 0.1 --round-timeout 8 "
                             "--fail-at-step 2:2 --quiet --metrics " +
                             metrics);
  ASSERT_EQ(result.exitCode, 0) << result.output;
  EXPECT_NE(result.output.find("rank 2: failure injected before round 2"),
            std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("the job goes on without it"), std::string::npos) << result.output;
  const auto lines = readLines(metrics);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["clients"], 6);
  EXPECT_EQ(lines[0]["dropped"], 0);
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(lines[r]["round"], r + 1);
    EXPECT_EQ(lines[r]["clients"], 3);  // rank 2 hosted clients 1, 3 and 5
    EXPECT_EQ(lines[r]["dropped"], 3);
  }
  for (const auto& line : lines) {
    for (const char* key : {"test_accuracy", "bytes_up", "bytes_down"})
      EXPECT_TRUE(line.contains(key)) << line;
    EXPECT_FALSE(line.contains("epsilon"));
    EXPECT_GT(line["bytes_down"].get<int64_t>(), line["bytes_up"].get<int64_t>() / 2);
  }
  EXPECT_GT(lines[2]["test_accuracy"].get<double>(), 0.3);
  std::filesystem::remove(metrics);
}

TEST(FederatedCli, SecureAggregationWithDpInOneProcess) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::string metrics = tempPath("sa.jsonl");
  const auto result = kolo::testing::runKolo(
      "train --strategy federated --secure-agg --dp-clip 1 --dp-noise 0.5 --train-limit 1000 "
      "--clients 10 "
      "--clients-per-round 5 --rounds 2 --local-batch 0 --quiet --metrics " +
      metrics);
  ASSERT_EQ(result.exitCode, 0) << result.output;
  const auto lines = readLines(metrics);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1]["clients"], 5);
  EXPECT_GT(lines[1]["epsilon"].get<double>(), lines[0]["epsilon"].get<double>());
  std::filesystem::remove(metrics);
}

TEST(FederatedCliFlags, BadFlagsAreNamed) {
  for (const auto& [args, words] : std::vector<std::pair<std::string, std::string>>{
           {"--partition zipf", "--partition 'zipf' is not accepted"},
           {"--clients 10 --clients-per-round 11",
            "--clients-per-round 11 is more than the 10 clients"},
           {"--dp-noise 1", "--dp-noise needs --dp-clip"},
           {"--prox-mu 0.1", "--prox-mu applies to FedProx only"},
           {"--algorithm ring", "--algorithm 'ring' is not accepted: use fedavg or fedprox"},
           {"--epochs 3", "counts --rounds and --local-epochs, not --epochs or --steps"}}) {
    const auto result = kolo::testing::runKolo("train --strategy federated --quiet " + args);
    EXPECT_NE(result.exitCode, 0) << args;
    EXPECT_NE(result.output.find(words), std::string::npos) << args << "\n" << result.output;
  }
}

// A table of one's own, as every strategy reads it: a CSV with string labels, the classes and
// the mlp's width from the file, clients on 2 hosts under kolo run, the standardisation saved
// with the weights.
TEST(FederatedCli, TrainsOnACsvTable) {
  const std::string csv = tempPath("table.csv"), weights = tempPath("table.safetensors");
  {
    std::ofstream out(csv);
    out << "x,noise,kind,z\n";
    uint64_t state = 7;
    auto uniform = [&state] {  // in [-1, 1)
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      return static_cast<double>(state >> 11) / 4503599627370496.0 - 1.0;
    };
    const char* names[] = {"west", "south", "north", "east"};
    for (int i = 0; i < 1200; ++i) {
      const double x = uniform(), z = uniform();
      out << x * 5 << "," << uniform() << "," << names[(x > 0) * 2 + (z > 0)] << "," << z + 3 << "\n";
    }
  }
  const auto result = kolo::testing::runKolo(
      "run -n 2 -- " + std::string(KOLO_BINARY_DIR) + "/src/cli/kolo train --strategy federated --data " + csv +
      " --label-column kind --clients 4 --clients-per-round 4 --rounds 8 --local-epochs 2 --local-batch 20 --lr 0.2 --quiet --save " +
      weights);
  ASSERT_EQ(result.exitCode, 0) << result.output;
  EXPECT_NE(result.output.find("labels=east=0,north=1,south=2,west=3"), std::string::npos) << result.output;
  double accuracy = 0.0;
  const size_t at = result.output.find("test_accuracy ");
  ASSERT_NE(at, std::string::npos) << result.output;
  ASSERT_EQ(std::sscanf(result.output.c_str() + at, "test_accuracy %lf", &accuracy), 1) << result.output;
  EXPECT_GT(accuracy, 0.8) << result.output;
  const kolo::checkpoint::SafetensorsFile saved = kolo::checkpoint::loadSafetensors(weights);
  EXPECT_EQ(saved.find("0.weight").shape()[1], 3) << "the mlp's width is the table's 3 features";
  EXPECT_TRUE(saved.metadata.count("standardize"));
  std::remove(csv.c_str());
  std::remove(weights.c_str());
}

// --init names the user's file: missing, it is an input-file error (exit code 3) as with
// every strategy, before any round.
TEST(FederatedCliFlags, MissingInitFileIsAnInputFileError) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const auto result = kolo::testing::runKolo(
      "train --strategy federated --quiet --train-limit 200 --rounds 1 --init " + tempPath("none.safetensors"));
  EXPECT_EQ(result.exitCode, 3) << result.output;
  EXPECT_NE(result.output.find("none.safetensors"), std::string::npos) << result.output;
}

// --save writes what every strategy's --save writes (the model's name and the rounds done as
// its step in the metadata), and --init of another strategy takes it.
TEST(FederatedCliFlags, SavedWeightsInitialiseAnotherRun) {
  KOLO_SKIP_WITHOUT_FASHION_MNIST();
  const std::string file = tempPath("federated_cnn.safetensors");
  const auto federated = kolo::testing::runKolo("train --strategy federated --model cnn --quiet --train-limit 200 "
                                                "--rounds 1 --clients 2 --save " + file);
  ASSERT_EQ(federated.exitCode, 0) << federated.output;
  const kolo::checkpoint::SafetensorsFile saved = kolo::checkpoint::loadSafetensors(file);
  EXPECT_EQ(saved.metadata.at("model"), "cnn");
  EXPECT_EQ(saved.metadata.at("step"), "1");
  const auto next = kolo::testing::runKolo("train --model cnn --quiet --train-limit 128 --steps 1 --init " + file);
  EXPECT_EQ(next.exitCode, 0) << next.output;
  std::remove(file.c_str());
}

}  // namespace
