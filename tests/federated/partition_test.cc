// Partitions of the training set over the clients (every sample exactly once; McMahan's
// shards give each client few labels; Dirichlet gives unequal sizes) and seeded sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"

namespace kolo::parallel::fed {
namespace {

// 1000 labels, 100 of each class, in an interleaved order.
Tensor labels() {
  std::vector<int64_t> y(1000);
  for (int64_t i = 0; i < 1000; ++i) y[i] = (i * 7) % 10;
  return Tensor::fromVector({1000}, y);
}

void expectEverySampleOnce(const std::vector<std::vector<int64_t>>& parts, int64_t n) {
  std::vector<int> seen(static_cast<size_t>(n), 0);
  for (const auto& part : parts) {
    EXPECT_FALSE(part.empty());
    for (int64_t i : part) ++seen.at(static_cast<size_t>(i));
  }
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(seen[i], 1) << "sample " << i;
}

TEST(FederatedPartition, IidSplitsEvenly) {
  const auto parts = partitionClients(labels(), 30, parsePartition("iid"), 1);
  ASSERT_EQ(parts.size(), 30u);
  expectEverySampleOnce(parts, 1000);
  for (const auto& part : parts) EXPECT_NEAR(static_cast<double>(part.size()), 1000.0 / 30, 1.0);
  EXPECT_EQ(parts, partitionClients(labels(), 30, parsePartition("iid"), 1));
  EXPECT_NE(parts, partitionClients(labels(), 30, parsePartition("iid"), 2));
}

TEST(FederatedPartition, ShardsGiveFewLabelsPerClient) {
  const Tensor y = labels();
  const std::vector<double> values = y.toDoubleVector();
  const auto parts = partitionClients(y, 50, parsePartition("shards:2"), 3);
  expectEverySampleOnce(parts, 1000);
  for (const auto& part : parts) {
    EXPECT_EQ(part.size(), 20u);
    std::set<int> classes;
    for (int64_t i : part) classes.insert(static_cast<int>(values[i]));
    EXPECT_LE(classes.size(), 2u);  // 100 shards of 10 samples never straddle two labels
  }
}

TEST(FederatedPartition, DirichletSkewsLabelsAndSizes) {
  const Tensor y = labels();
  const std::vector<double> values = y.toDoubleVector();
  const auto parts = partitionClients(y, 20, parsePartition("dirichlet:0.1"), 5);
  expectEverySampleOnce(parts, 1000);
  size_t smallest = 1000, largest = 0, dominated = 0;
  for (const auto& part : parts) {
    smallest = std::min(smallest, part.size());
    largest = std::max(largest, part.size());
    std::vector<size_t> perClass(10, 0);
    for (int64_t i : part) ++perClass[static_cast<size_t>(values[i])];
    dominated += 2 * *std::max_element(perClass.begin(), perClass.end()) >= part.size();
  }
  EXPECT_GT(largest, 2 * smallest);
  // alpha 0.1: one label makes up at least half of most clients' data (about a tenth with IID).
  EXPECT_GE(dominated, 14u);
}

TEST(FederatedPartition, BadSpecsAreNamed) {
  for (const char* text :
       {"iid:3", "shards", "shards:0", "shards:x", "dirichlet:-1", "dirichlet:", "zipf"}) {
    try {
      parsePartition(text);
      ADD_FAILURE() << text << " was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(partitionClients(labels(), 600, parsePartition("shards:2"), 0), InvalidArgument);
}

TEST(FederatedSampling, SeededDistinctAndSorted) {
  const std::vector<int> a = sampleClients(100, 10, 4, 9);
  EXPECT_EQ(a, sampleClients(100, 10, 4, 9));
  EXPECT_NE(a, sampleClients(100, 10, 5, 9));
  EXPECT_NE(a, sampleClients(100, 10, 4, 10));
  ASSERT_EQ(a.size(), 10u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::set<int>(a.begin(), a.end()).size(), 10u);
  // Over many rounds every client is picked about K/C of the time.
  std::vector<int> picked(100, 0);
  for (int64_t r = 1; r <= 1000; ++r)
    for (int c : sampleClients(100, 10, r, 9)) ++picked[c];
  for (int count : picked) EXPECT_NEAR(count, 100, 45);
  EXPECT_THROW(sampleClients(10, 11, 1, 0), InvalidArgument);
}

}  // namespace
}  // namespace kolo::parallel::fed
