// openTrainingData over a CSV table: a seeded tenth held out (the same for every seed's run,
// another for another seed), both splits standardised with the training split's statistics and
// flat, the classes named; a test table of another width and labels without .npy inputs are
// refused in TrainingDataSpec's words.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "data/files_support.h"
#include "kolo/error.h"
#include "kolo/training_data.h"

namespace kolo::data {
namespace {

void writeTable(const std::string& path, int rows, int features) {
  std::ofstream csv(path);
  for (int f = 0; f < features; ++f) csv << "x" << f << ",";
  csv << "label\n";
  for (int r = 0; r < rows; ++r) {
    for (int f = 0; f < features; ++f) csv << (r * 7 + f * 13) % 11 * (f + 1) * 100 << ",";
    csv << (r % 3 == 0 ? "cat" : "dog") << "\n";
  }
}

TEST(TrainingData, ATableHeldOutStandardisedAndFlat) {
  testing::ScratchDir dir;
  writeTable(dir / "t.csv", 100, 3);
  const TrainingData read = openTrainingData({.path = dir / "t.csv", .seed = 4});
  EXPECT_TRUE(read.heldOut);
  EXPECT_EQ(read.train->size(), 90);
  EXPECT_EQ(read.validation->size(), 10);
  EXPECT_EQ(read.sampleShape, Shape({3}));
  EXPECT_EQ(read.classes, 2);
  EXPECT_EQ(read.classNames, std::vector<std::string>({"cat", "dog"}));
  EXPECT_FALSE(read.standardizer.empty());
  std::vector<int64_t> all(90);
  std::iota(all.begin(), all.end(), 0);
  const Batch batch = read.train->gather(all);
  ASSERT_EQ(batch.inputs.shape(), Shape({90, 3}));
  // Standardised with the training split's own statistics: mean 0, variance 1 per feature.
  const std::vector<double> x = batch.inputs.toDoubleVector();
  for (int f = 0; f < 3; ++f) {
    double sum = 0, squares = 0;
    for (int r = 0; r < 90; ++r) sum += x[r * 3 + f], squares += x[r * 3 + f] * x[r * 3 + f];
    EXPECT_NEAR(sum / 90, 0.0, 1e-5) << "feature " << f;
    EXPECT_NEAR(squares / 90, 1.0, 1e-4) << "feature " << f;
  }
  // The held-out tenth is a function of the seed.
  const auto heldOut = [&](uint64_t seed) {
    const TrainingData other = openTrainingData({.path = dir / "t.csv", .standardize = false, .seed = seed});
    std::vector<int64_t> ten(10);
    std::iota(ten.begin(), ten.end(), 0);
    return other.validation->gather(ten).inputs.toDoubleVector();
  };
  EXPECT_EQ(heldOut(4), heldOut(4));
  EXPECT_NE(heldOut(4), heldOut(5));
  EXPECT_TRUE(openTrainingData({.path = dir / "t.csv", .standardize = false}).standardizer.empty());
}

TEST(TrainingData, OptionsThatDoNotFitTheDataAreNamed) {
  testing::ScratchDir dir;
  writeTable(dir / "t.csv", 20, 3);
  writeTable(dir / "narrow.csv", 20, 2);
  const auto refusal = [](const TrainingDataSpec& spec) -> std::string {
    try {
      openTrainingData(spec);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(refusal({.path = dir / "t.csv", .testPath = dir / "narrow.csv"})
                .find("TrainingDataSpec::testPath " + (dir / "narrow.csv") + " has 2 feature columns, "
                      "TrainingDataSpec::path " + (dir / "t.csv") + " has 3"),
            std::string::npos);
  EXPECT_NE(refusal({.path = dir / "t.csv", .labelsPath = dir / "y.npy"})
                .find("TrainingDataSpec::labelsPath and TrainingDataSpec::testLabelsPath go with .npy arrays"),
            std::string::npos);
}

}  // namespace
}  // namespace kolo::data
