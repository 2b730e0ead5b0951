// The federated server: per round it samples the clients, publishes the model and the
// selection in the store, collects the updates until all arrived or the round timeout
// passed, refuses bad ones (naming the client) and applies the weighted mean; with secure
// aggregation it runs the server's side of Bonawitz et al.'s four steps, with DP it adds
// Gaussian noise to the sum of clipped updates and advances the RDP accountant.
#include <sodium.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"
#include "parallel/federated/detail.h"
#include "parallel/federated/sa_wire.h"

namespace kolo::parallel::fed {
namespace {

using Clock = std::chrono::steady_clock;
using detail::roundKey;

comm::Bytes floatBytes(const std::vector<float>& values) {
  const auto* p = reinterpret_cast<const uint8_t*>(values.data());
  return comm::Bytes(p, p + values.size() * sizeof(float));
}

std::string planText(int64_t round, const std::vector<int>& selected, bool stop) {
  nlohmann::json plan = {{"round", round}, {"stop", stop}, {"selected", selected}};
  return plan.dump();
}

std::vector<int> idsOf(const std::map<int, sa::PublicKeys>& keys) {
  std::vector<int> ids;
  for (const auto& [id, k] : keys) ids.push_back(id);
  return ids;
}

}  // namespace

void checkOptions(const FederatedOptions& o) {
  KOLO_REQUIRE(o.clients >= 1, "federated: FederatedOptions::clients must be at least 1, got ", o.clients);
  KOLO_REQUIRE(o.clientsPerRound >= 1, "federated: FederatedOptions::clientsPerRound must be at least 1, got ",
               o.clientsPerRound);
  KOLO_REQUIRE(o.clientsPerRound <= o.clients, "federated: FederatedOptions::clientsPerRound ", o.clientsPerRound,
               " is more than the ", o.clients, " clients");
  KOLO_REQUIRE(o.rounds >= 1, "federated: FederatedOptions::rounds must be at least 1, got ", o.rounds);
  KOLO_REQUIRE(o.serverLr > 0.0, "federated: FederatedOptions::serverLr must be above 0, got ", o.serverLr);
  KOLO_REQUIRE(o.client.method == Method::FedProx || o.client.proxMu == 0.0,
               "federated: LocalTrainingOptions::proxMu applies to FedProx only");
  KOLO_REQUIRE(o.saThreshold == 0 || o.secureAgg,
               "federated: FederatedOptions::saThreshold applies to FederatedOptions::secureAgg only");
  KOLO_REQUIRE(o.dpNoise == 0.0 || o.dpClip > 0.0,
               "federated: FederatedOptions::dpNoise needs FederatedOptions::dpClip (the noise is relative to the clip)");
  KOLO_REQUIRE(o.simulatedDropRate >= 0.0 && o.simulatedDropRate <= 1.0,
               "federated: FederatedOptions::simulatedDropRate must lie in [0, 1], got ", o.simulatedDropRate);
  KOLO_REQUIRE(o.dpDelta > 0.0 && o.dpDelta < 1.0, "federated: FederatedOptions::dpDelta must lie in (0, 1), got ",
               o.dpDelta);
}

FederatedServer::FederatedServer(std::shared_ptr<comm::Store> store, FederatedOptions options,
                                 std::vector<float> initial)
    : store_(std::move(store)), options_(std::move(options)), weights_(std::move(initial)) {
  checkOptions(options_);
  if (options_.secureAgg) {
    KOLO_REQUIRE(options_.clientsPerRound <= 1024,
                 "federated: FederatedOptions::secureAgg sums at most 1024 clients a round, got ",
                 options_.clientsPerRound);
    if (options_.saThreshold == 0) options_.saThreshold = options_.clientsPerRound / 2 + 1;
    KOLO_REQUIRE(options_.saThreshold >= 1 && options_.saThreshold <= options_.clientsPerRound,
                 "federated: FederatedOptions::saThreshold must be in [1, ", options_.clientsPerRound, "], got ",
                 options_.saThreshold);
  }
  if (options_.dpClip > 0.0) {
    const double q = static_cast<double>(options_.clientsPerRound) / options_.clients;
    accountant_ = std::make_unique<RdpAccountant>(q, options_.dpNoise);
  }
}

int FederatedServer::awaitHosts(int hosts, std::chrono::milliseconds timeout) {
  std::vector<int> ids(static_cast<size_t>(hosts));
  for (int h = 0; h < hosts; ++h) ids[h] = h;
  return static_cast<int>(
      detail::collect(*store_, "fed/host/ready/", ids, Clock::now() + timeout).size());
}

void FederatedServer::cleanUp(int64_t round) {
  // Keys of a round two behind: a late client host may still have been reading the last one.
  if (round < 1) return;
  const std::vector<int> selected =
      sampleClients(options_.clients, options_.clientsPerRound, round, options_.seed);
  for (const char* what : {"plan", "model", "sa/u1", "sa/u2", "sa/u3"})
    store_->remove(roundKey(round, what));
  for (int c : selected) {
    for (const char* what :
         {"update/", "sa/keys/", "sa/shares/", "sa/inbox/", "sa/masked/", "sa/unmask/"})
      store_->remove(roundKey(round, what + std::to_string(c)));
  }
}

RoundReport FederatedServer::runRound() {
  const auto start = Clock::now();
  ++round_;
  cleanUp(round_ - 2);
  RoundReport report;
  report.round = round_;
  const std::vector<int> selected =
      sampleClients(options_.clients, options_.clientsPerRound, round_, options_.seed);
  const comm::Bytes model = floatBytes(weights_);
  store_->set(roundKey(round_, "model"), model);
  const std::string plan = planText(round_, selected, false);
  store_->setString(roundKey(round_, "plan"), plan);
  report.bytesDown = static_cast<int64_t>(selected.size() * (model.size() + plan.size()));
  report = options_.secureAgg ? secureRound(selected, report) : plainRound(selected, report);
  report.dropped = static_cast<int>(selected.size()) - report.clients;
  if (accountant_) report.epsilon = accountant_->epsilon(options_.dpDelta);
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return report;
}

void FederatedServer::finish() {
  store_->setString(roundKey(round_ + 1, "plan"), planText(round_ + 1, {}, true));
}

void FederatedServer::apply(const std::vector<double>& sum, double weight, int selected) {
  const bool dp = options_.dpClip > 0.0;
  if (accountant_) accountant_->step();
  if (!dp && weight <= 0.0) return;  // nobody answered: the model stays
  std::vector<double> update = sum.empty() ? std::vector<double>(weights_.size(), 0.0) : sum;
  if (dp) {
    // DP-FedAvg with a fixed denominator: (sum of clipped updates + N(0, (sigma C)^2)) / K.
    if (options_.dpNoise > 0.0) {
      uint64_t seed = 0;
      randombytes_buf(&seed, sizeof seed);
      Generator noise(seed);
      const double stddev = options_.dpNoise * options_.dpClip;
      for (double& v : update) v += stddev * noise.normal();
    }
    weight = static_cast<double>(selected);
  }
  for (size_t i = 0; i < weights_.size(); ++i)
    weights_[i] += static_cast<float>(options_.serverLr * (update[i] / weight));
}

RoundReport FederatedServer::plainRound(const std::vector<int>& selected, RoundReport report) {
  const auto got = detail::collect(*store_, roundKey(round_, "update/"), selected,
                                   Clock::now() + options_.roundTimeout);
  Aggregator aggregator(round_, weights_.size());
  for (const auto& [client, bytes] : got) {
    report.bytesUp += static_cast<int64_t>(bytes.size());
    try {
      const Update update = decodeUpdate(bytes, "client " + std::to_string(client));
      if (update.client != client)
        KOLO_THROW(Mismatch, "client ", client, " sent an update labelled client ", update.client,
                   "; refused");
      if (options_.dpClip > 0.0) {
        aggregator.addUnweighted(update);
      } else {
        aggregator.add(update);
      }
    } catch (const Error& e) {
      report.refused.push_back(e.what());
    }
  }
  report.clients = aggregator.added();
  apply(aggregator.sum(), aggregator.weight(), static_cast<int>(selected.size()));
  return report;
}

RoundReport FederatedServer::secureRound(const std::vector<int>& selected, RoundReport report) {
  lastSecureSum_.clear();
  const int threshold = options_.saThreshold;
  const size_t length = weights_.size() + 1;
  std::vector<const char*> unpublished = {"sa/u1", "sa/u2", "sa/u3"};
  // Publishes a step's list of clients; an empty list tells the hosts the round is over.
  auto publish = [&](const char* what, const comm::Bytes& bytes, size_t receivers) {
    store_->set(roundKey(round_, what), bytes);
    report.bytesDown += static_cast<int64_t>(bytes.size() * receivers);
    unpublished.erase(unpublished.begin());
  };
  auto abandon = [&](const std::string& why) {
    report.refused.push_back("round " + std::to_string(round_) + " abandoned: " + why);
    while (!unpublished.empty()) publish(unpublished.front(), sa::encodeIds({}), 0);
    report.clients = 0;
    apply({}, 0.0, static_cast<int>(selected.size()));
    return report;
  };
  auto refuse = [&](const Error& e) { report.refused.push_back(e.what()); };

  // 1. Advertised keys.
  std::map<int, sa::PublicKeys> u1;
  for (const auto& [client, bytes] : detail::collect(
           *store_, roundKey(round_, "sa/keys/"), selected, Clock::now() + options_.roundTimeout)) {
    report.bytesUp += static_cast<int64_t>(bytes.size());
    try {
      u1[client] = sa::decodeKeys(bytes, "client " + std::to_string(client));
    } catch (const Error& e) {
      refuse(e);
    }
  }
  if (u1.size() < static_cast<size_t>(threshold))
    return abandon(std::to_string(u1.size()) +
                   " clients advertised keys, fewer than the threshold " +
                   std::to_string(threshold));
  publish("sa/u1", sa::encodeKeyList(u1), u1.size());

  // 2. Encrypted shares, relayed to their recipients.
  std::map<int, std::map<int, comm::Bytes>> sent;  // sender -> recipient -> box
  for (const auto& [client, bytes] :
       detail::collect(*store_, roundKey(round_, "sa/shares/"), idsOf(u1),
                       Clock::now() + options_.roundTimeout)) {
    report.bytesUp += static_cast<int64_t>(bytes.size());
    try {
      auto boxes = sa::decodeBoxes(bytes, "client " + std::to_string(client));
      for (const auto& [peer, k] : u1) {
        if (!boxes.count(peer))
          KOLO_THROW(Mismatch, "client ", client, " sent no shares for client ", peer, "; refused");
      }
      sent[client] = std::move(boxes);
    } catch (const Error& e) {
      refuse(e);
    }
  }
  std::vector<int> u2;
  for (const auto& [client, boxes] : sent) u2.push_back(client);
  if (u2.size() < static_cast<size_t>(threshold))
    return abandon(std::to_string(u2.size()) +
                   " clients shared their keys, fewer than the threshold " +
                   std::to_string(threshold));
  for (int recipient : u2) {
    std::map<int, comm::Bytes> inbox;
    for (int sender : u2) inbox[sender] = sent[sender][recipient];
    const comm::Bytes bytes = sa::encodeBoxes(inbox);
    store_->set(roundKey(round_, "sa/inbox/" + std::to_string(recipient)), bytes);
    report.bytesDown += static_cast<int64_t>(bytes.size());
  }
  publish("sa/u2", sa::encodeIds(u2), u2.size());

  // 3. Masked inputs.
  std::map<int, std::vector<uint64_t>> masked;
  for (const auto& [client, bytes] : detail::collect(*store_, roundKey(round_, "sa/masked/"), u2,
                                                     Clock::now() + options_.roundTimeout)) {
    report.bytesUp += static_cast<int64_t>(bytes.size());
    try {
      masked[client] = sa::decodeMasked(bytes, round_, client, length);
    } catch (const Error& e) {
      refuse(e);
    }
  }
  std::vector<int> u3;
  for (const auto& [client, words] : masked) u3.push_back(client);
  if (u3.size() < static_cast<size_t>(threshold))
    return abandon(std::to_string(u3.size()) +
                   " clients sent masked inputs, fewer than the threshold " +
                   std::to_string(threshold));
  publish("sa/u3", sa::encodeIds(u3), u3.size());

  // 4. Revealed shares: survivors' self-mask seeds, dropped clients' mask keys.
  std::map<int, std::map<int, sa::Share>> revealed;
  for (const auto& [client, bytes] : detail::collect(*store_, roundKey(round_, "sa/unmask/"), u3,
                                                     Clock::now() + options_.roundTimeout)) {
    report.bytesUp += static_cast<int64_t>(bytes.size());
    try {
      revealed[client] = sa::decodeReveal(bytes, "client " + std::to_string(client));
    } catch (const Error& e) {
      refuse(e);
    }
  }
  try {
    lastSecureSum_ = sa::unmaskSum(round_, masked, u1, u2, revealed, threshold);
  } catch (const Error& e) {
    return abandon(e.what());
  }
  const std::vector<double> sum = sa::dequantize(lastSecureSum_);
  report.clients = static_cast<int>(u3.size());
  apply(sum, static_cast<double>(lastSecureSum_.back()), static_cast<int>(selected.size()));
  return report;
}

}  // namespace kolo::parallel::fed
