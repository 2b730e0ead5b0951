// The server's weighted mean and its refusals: an update of the wrong shape, with a NaN, for
// a stale round, or twice from one client is refused with a message naming the client; the
// update frame's decoder refuses malformed bytes before allocating.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kolo/error.h"
#include "kolo/nn/layers.h"
#include "kolo/parallel/federated.h"

namespace kolo::parallel::fed {
namespace {

Update update(int client, int64_t samples, std::vector<float> delta, int64_t round = 3) {
  return Update{round, client, samples, std::move(delta)};
}

template <class E>
void expectRefused(Aggregator& aggregator, const Update& u, const std::string& words) {
  try {
    aggregator.add(u);
    ADD_FAILURE() << "accepted";
  } catch (const E& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("client " + std::to_string(u.client)), std::string::npos) << message;
    EXPECT_NE(message.find(words), std::string::npos) << message;
  }
}

TEST(FederatedAggregator, MeanWeightedBySamples) {
  Aggregator aggregator(3, 2);
  aggregator.add(update(0, 1, {1.0f, 4.0f}));
  aggregator.add(update(5, 3, {3.0f, 0.0f}));
  EXPECT_EQ(aggregator.added(), 2);
  const std::vector<float> mean = aggregator.mean();
  EXPECT_FLOAT_EQ(mean[0], (1.0f + 9.0f) / 4);
  EXPECT_FLOAT_EQ(mean[1], 1.0f);
}

TEST(FederatedAggregator, RefusesBadUpdatesAndGoesOn) {
  Aggregator aggregator(3, 3);
  expectRefused<Mismatch>(aggregator, update(1, 10, {1, 2}), "2 values, the model has 3");
  expectRefused<InvalidArgument>(aggregator, update(2, 10, {1, NAN, 2}), "element 1");
  expectRefused<InvalidArgument>(aggregator, update(3, 10, {1, INFINITY, 2}), "non-finite");
  expectRefused<Mismatch>(aggregator, update(4, 10, {1, 1, 1}, 2), "round 2 in round 3 (stale)");
  expectRefused<InvalidArgument>(aggregator, update(6, 0, {1, 1, 1}), "0 samples");
  aggregator.add(update(7, 2, {2, 2, 2}));
  expectRefused<Mismatch>(aggregator, update(7, 2, {2, 2, 2}), "second update");
  EXPECT_EQ(aggregator.added(), 1);
  EXPECT_EQ(aggregator.mean(), (std::vector<float>{2, 2, 2}));
}

TEST(FederatedUpdateFrame, RoundTripsAndRefusesMalformedBytes) {
  const Update u = update(9, 12, {0.5f, -1.5f, 3.0f}, 4);
  const comm::Bytes bytes = encodeUpdate(u);
  const Update back = decodeUpdate(bytes, "client 9");
  EXPECT_EQ(back.round, 4);
  EXPECT_EQ(back.client, 9);
  EXPECT_EQ(back.samples, 12);
  EXPECT_EQ(back.delta, u.delta);
  comm::Bytes cut(bytes.begin(), bytes.end() - 1);
  EXPECT_THROW(decodeUpdate(cut, "client 9"), FormatError);
  comm::Bytes huge = bytes;
  huge[4 + 8 + 4 + 8 + 7] = 0x40;  // the count's top byte: 2^62 values announced
  try {
    decodeUpdate(huge, "client 9");
    ADD_FAILURE() << "accepted";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("client 9"), std::string::npos) << e.what();
  }
  comm::Bytes magic = bytes;
  magic[0] ^= 1;
  EXPECT_THROW(decodeUpdate(magic, "client 9"), FormatError);
}

// A flat state round-trips through a model; a vector of another length is a Mismatch naming
// both lengths, and the model keeps its weights.
TEST(FederatedWeights, LoadTakesFlattenedWeightsAndRefusesAnotherLength) {
  Generator gen(1);
  nn::Linear model(3, 2, gen);  // 6 weights and 2 biases
  std::vector<float> flat = flattenState(model);
  ASSERT_EQ(flat.size(), 8u);
  for (float& v : flat) v += 1.0f;
  loadState(model, flat);
  EXPECT_EQ(flattenState(model), flat);
  try {
    loadState(model, std::vector<float>(7, 0.0f));
    ADD_FAILURE() << "7 weights were taken";
  } catch (const Mismatch& e) {
    EXPECT_NE(
        std::string(e.what()).find("7 values for a model whose parameters and buffers hold 8"),
        std::string::npos)
        << e.what();
  }
  EXPECT_EQ(flattenState(model), flat);
}

}  // namespace
}  // namespace kolo::parallel::fed
