// `kolo train` on data files: a CSV table with string classes trains an mlp as wide as its
// features with as many outputs as its classes, its standardisation saved with the weights; a
// u16 token file of a text's bytes trains exactly as --data TEXT (the same losses); a bad row
// ends the run with the input-file exit code and the file:line; an image folder of mixed sizes,
// resized, trains the cnn and tests it on held-out images normalised as the training ones.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kolo/exit_codes.h"
#include "kolo/safetensors.h"
#include "run_kolo.h"

namespace {

namespace fs = std::filesystem;
using kolo::testing::RunResult;
using kolo::testing::runKolo;

class TrainDataCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kolo_data_cli_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

// The last line of `output` that starts with `prefix`.
std::string lineStarting(const std::string& output, const std::string& prefix) {
  std::string found;
  size_t at = 0;
  while ((at = output.find(prefix, at)) != std::string::npos) {
    if (at == 0 || output[at - 1] == '\n') found = output.substr(at, output.find('\n', at) - at);
    ++at;
  }
  return found;
}

TEST_F(TrainDataCliTest, ACsvTableSizesTheMlpAndItsStandardisationIsSaved) {
  // 3 features on scales a thousand apart; the class (4 names) is the quadrant of features 0
  // and 2, so an unstandardised network would see mostly feature 1.
  std::ofstream csv(file("t.csv"));
  csv << "x,noise,kind,z\n";
  const char* names[] = {"north", "east", "south", "west"};
  uint64_t state = 7;
  auto draw = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return double(state >> 11) / double(1ull << 53) - 0.5;
  };
  for (int i = 0; i < 600; ++i) {
    const double x = draw(), noise = draw() * 1000, z = draw() * 0.01;
    csv << x << "," << noise << "," << names[(x > 0) * 2 + (z > 0)] << "," << z << "\n";
  }
  csv.close();
  const RunResult run = runKolo("train --data " + file("t.csv") + " --label-column kind --epochs 8 --batch 32 "
                                "--no-progress --save " + file("w.safetensors"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("labels=east=0,north=1,south=2,west=3"), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("held out a test split"), std::string::npos) << run.output;
  double accuracy = 0.0;
  ASSERT_EQ(std::sscanf(lineStarting(run.output, "test_accuracy").c_str(), "test_accuracy %lf", &accuracy), 1)
      << run.output;
  EXPECT_GT(accuracy, 0.85) << run.output;
  const kolo::checkpoint::SafetensorsFile weights = kolo::checkpoint::loadSafetensors(file("w.safetensors"));
  EXPECT_EQ(weights.find("0.weight").shape(), (kolo::Shape{512, 3}));
  EXPECT_EQ(weights.find("4.weight").shape(), (kolo::Shape{4, 256}));
  ASSERT_TRUE(weights.metadata.count("standardize"));
  EXPECT_NE(weights.metadata.at("standardize").find(';'), std::string::npos);
}

TEST_F(TrainDataCliTest, AU16TokenFileOfATextsBytesTrainsAsTheText) {
  std::string text;
  for (int i = 0; i < 120; ++i) text += "kolo reads token files as it reads a text's bytes, window for window. ";
  std::ofstream(file("t.txt"), std::ios::binary) << text;
  std::ofstream tokens(file("t.u16"), std::ios::binary);
  for (const char c : text) {
    const unsigned char low = static_cast<unsigned char>(c), high = 0;
    tokens << low << high;
  }
  tokens.close();
  const std::string common = " --model lm --steps 12 --layers 1 --d-model 16 --heads 2 --seq-len 16 --no-progress";
  const RunResult fromText = runKolo("train --data " + file("t.txt") + common);
  const RunResult fromTokens = runKolo("train --data " + file("t.u16") + " --token-dtype u16 --vocab 256" + common);
  ASSERT_EQ(fromText.exitCode, 0) << fromText.output;
  ASSERT_EQ(fromTokens.exitCode, 0) << fromTokens.output;
  const std::string line = lineStarting(fromText.output, "train_loss");
  ASSERT_FALSE(line.empty()) << fromText.output;
  // The same losses to the last digit (the wall time differs).
  EXPECT_EQ(line.substr(0, line.find(" steps")), lineStarting(fromTokens.output, "train_loss").substr(0, line.find(" steps")));
}

TEST_F(TrainDataCliTest, AnImageFolderOfMixedSizesTrainsTheCnnOnHeldOutImages) {
  // Two classes told apart by brightness, JPEGs of 18 to 29 pixels a side written by PIL.
  const std::string script = file("make.py");
  std::ofstream(script) << "import os, numpy as np\nfrom PIL import Image\nrng = np.random.default_rng(0)\n"
                           "for c, level in (('dark', 40), ('light', 200)):\n"
                           "    os.makedirs('" + file("images") + "/' + c)\n"
                           "    for i in range(30):\n"
                           "        h, w = rng.integers(18, 30, 2)\n"
                           "        a = level + rng.integers(0, 40, (h, w, 3))\n"
                           "        Image.fromarray(a.astype(np.uint8)).save('" + file("images") + "/%s/%d.jpg' % (c, i))\n";
  if (std::system(("/usr/bin/python3 " + script + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "/usr/bin/python3 with numpy and PIL is needed to write the images";
  const RunResult run = runKolo("train --data " + file("images") +
                                " --model cnn --image-size 16 --epochs 3 --batch 8 --no-progress --save " +
                                file("w.safetensors"));
  ASSERT_EQ(run.exitCode, 0) << run.output;
  EXPECT_NE(run.output.find("labels=dark=0,light=1"), std::string::npos) << run.output;
  // The per-channel normalisation the weights expect, with them: three channels' means
  // between the two classes' levels.
  const kolo::checkpoint::SafetensorsFile weights = kolo::checkpoint::loadSafetensors(file("w.safetensors"));
  ASSERT_TRUE(weights.metadata.count("normalize"));
  float mean[3] = {}, stddev[3] = {};
  ASSERT_EQ(std::sscanf(weights.metadata.at("normalize").c_str(), "mean=%f,%f,%f;std=%f,%f,%f", &mean[0], &mean[1],
                        &mean[2], &stddev[0], &stddev[1], &stddev[2]),
            6)
      << weights.metadata.at("normalize");
  for (int c = 0; c < 3; ++c) {
    EXPECT_GT(mean[c], 40 / 255.0) << weights.metadata.at("normalize");
    EXPECT_LT(mean[c], 240 / 255.0) << weights.metadata.at("normalize");
    EXPECT_GT(stddev[c], 0.1) << weights.metadata.at("normalize");
  }
  double accuracy = 0.0;
  ASSERT_EQ(std::sscanf(lineStarting(run.output, "test_accuracy").c_str(), "test_accuracy %lf", &accuracy), 1)
      << run.output;
  EXPECT_EQ(accuracy, 1.0) << run.output;
}

TEST_F(TrainDataCliTest, ABadRowIsAnInputFileErrorNamingFileAndLine) {
  std::ofstream(file("bad.csv")) << "a,b,label\n1,2,0\n3,oops,1\n";
  const RunResult run = runKolo("train --data " + file("bad.csv") + " --steps 1 --no-progress");
  EXPECT_EQ(run.exitCode, kolo::kExitInputFile) << run.output;
  EXPECT_NE(run.output.find(file("bad.csv") + ":3: column 'b': 'oops' is not a finite number"), std::string::npos)
      << run.output;
}

}  // namespace
