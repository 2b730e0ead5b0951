// A client host: one process (or thread) that plays the simulated clients c with
// c % processes == index. Each round it reads the plan and the model from the store, trains
// its selected clients one after the other with one shared model, and sends their updates
// (plainly, or through the client's side of secure aggregation).
#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"
#include "parallel/federated/detail.h"
#include "parallel/federated/sa_wire.h"

namespace kolo::parallel::fed {
namespace {

using detail::roundKey;

std::vector<float> floatsOf(const comm::Bytes& bytes, size_t expected) {
  KOLO_REQUIRE(bytes.size() == expected * sizeof(float), "federated: the server's model has ",
               bytes.size(), " bytes, the client's model needs ", expected * sizeof(float));
  std::vector<float> values(expected);
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

bool contains(const std::vector<int>& ids, int id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

ClientHost::ClientHost(std::shared_ptr<comm::Store> store, FederatedOptions options, int index,
                       int processes, std::shared_ptr<nn::Module> model,
                       std::shared_ptr<const data::Dataset> data,
                       std::vector<std::vector<int64_t>> partition)
    : store_(std::move(store)),
      options_(std::move(options)),
      index_(index),
      processes_(processes),
      model_(std::move(model)),
      data_(std::move(data)),
      partition_(std::move(partition)) {
  KOLO_REQUIRE(processes_ >= 1 && index_ >= 0 && index_ < processes_, "federated: client host ",
               index_, " of ", processes_, " does not exist");
  KOLO_REQUIRE(partition_.size() == static_cast<size_t>(options_.clients),
               "federated: ", partition_.size(), " partitions for ", options_.clients, " clients");
  options_.client.dpClip = options_.dpClip;
  options_.client.seed = options_.seed;
  if (options_.secureAgg && options_.saThreshold == 0)
    options_.saThreshold = options_.clientsPerRound / 2 + 1;
}

bool ClientHost::drops(int64_t round, int client) const {
  if (options_.simulatedDropRate <= 0.0) return false;
  Generator generator(detail::mixSeed(options_.seed, 0xd209 + static_cast<uint64_t>(client),
                                      static_cast<uint64_t>(round)));
  return generator.uniform() < options_.simulatedDropRate;
}

void ClientHost::serve(std::chrono::milliseconds idleTimeout) {
  while (serveRound(idleTimeout)) {
  }
}

bool ClientHost::serveRound(std::chrono::milliseconds idleTimeout) {
  if (round_ == 0) store_->setString("fed/host/ready/" + std::to_string(index_), "ready");
  const int64_t round = ++round_;
  const std::string planText = store_->getString(roundKey(round, "plan"), idleTimeout);
  nlohmann::json plan;
  try {
    plan = nlohmann::json::parse(planText);
  } catch (const std::exception& e) {
    KOLO_THROW(FormatError, "federated: the plan of round ", round, " is not JSON: ", e.what());
  }
  if (plan.value("stop", false)) return false;
  const std::vector<int> selected = plan.at("selected").get<std::vector<int>>();
  std::vector<int> mine;
  for (int c : selected) {
    if (c % processes_ == index_) mine.push_back(c);
  }
  if (mine.empty()) return true;
  // The model is written before the plan: missing, it was cleaned away because this host
  // fell two rounds behind, and the round is over for it.
  if (!store_->check({roundKey(round, "model")})) return true;
  comm::Bytes model;
  try {
    model = store_->get(roundKey(round, "model"), idleTimeout);
  } catch (const Timeout&) {
    return true;
  }
  const std::vector<float> global = floatsOf(model, flattenState(*model_).size());
  if (options_.secureAgg) {
    secureRound(round, mine, selected, global);
  } else {
    plainRound(round, mine, global);
  }
  return true;
}

void ClientHost::plainRound(int64_t round, const std::vector<int>& mine,
                            const std::vector<float>& global) {
  for (int c : mine) {
    Update update;
    update.round = round;
    update.client = c;
    update.samples = static_cast<int64_t>(partition_[c].size());
    update.delta = trainClient(*model_, global, *data_, partition_[c], options_.client, round, c);
    const std::string key = roundKey(round, "update/" + std::to_string(c));
    if (drops(round, c)) {
      detail::announceLeave(*store_, key);
      continue;
    }
    if (transform_) transform_(update);
    store_->set(key, encodeUpdate(update));
  }
}

void ClientHost::secureRound(int64_t round, const std::vector<int>& mine,
                             const std::vector<int>& selected, const std::vector<float>& global) {
  // Train first: the key exchange then runs while no client host is busy computing.
  const std::chrono::milliseconds wait = options_.roundTimeout * 4;
  std::map<int, std::vector<uint64_t>> inputs;
  std::map<int, std::unique_ptr<sa::Client>> parties;
  for (int c : mine) {
    Update update;
    update.round = round;
    update.client = c;
    update.samples = static_cast<int64_t>(partition_[c].size());
    update.delta = trainClient(*model_, global, *data_, partition_[c], options_.client, round, c);
    if (transform_) transform_(update);
    // DP-FedAvg weighs every clipped update alike; FedAvg by the client's sample count.
    const int64_t weight = options_.dpClip > 0.0 ? 1 : static_cast<int64_t>(partition_[c].size());
    inputs[c] = sa::quantize(update.delta, weight);
    parties[c] = std::make_unique<sa::Client>(round, c, options_.saThreshold);
    store_->set(roundKey(round, "sa/keys/" + std::to_string(c)),
                sa::encodeKeys(parties[c]->publicKeys()));
  }
  const auto u1 =
      sa::decodeKeyList(store_->get(roundKey(round, "sa/u1"), wait), "the server's key list");
  for (int c : mine) {
    if (!u1.count(c)) continue;
    store_->set(roundKey(round, "sa/shares/" + std::to_string(c)),
                sa::encodeBoxes(parties[c]->shareKeys(u1)));
  }
  const std::vector<int> u2 =
      sa::decodeIds(store_->get(roundKey(round, "sa/u2"), wait), "the server's list u2");
  std::map<int, std::map<int, comm::Bytes>> inboxes;
  for (int c : mine) {
    if (!contains(u2, c)) continue;
    inboxes[c] =
        sa::decodeBoxes(store_->get(roundKey(round, "sa/inbox/" + std::to_string(c)), wait),
                        "the server's relay to client " + std::to_string(c));
    // A dropping client leaves after the key exchange: its pairwise masks must be recovered.
    const std::string key = roundKey(round, "sa/masked/" + std::to_string(c));
    if (drops(round, c)) {
      detail::announceLeave(*store_, key);
      continue;
    }
    store_->set(key, sa::encodeMasked(round, c, parties[c]->maskInput(inputs[c], u2)));
  }
  const std::vector<int> u3 =
      sa::decodeIds(store_->get(roundKey(round, "sa/u3"), wait), "the server's list u3");
  for (int c : mine) {
    if (!contains(u3, c)) continue;
    store_->set(roundKey(round, "sa/unmask/" + std::to_string(c)),
                sa::encodeReveal(parties[c]->unmask(u2, u3, inboxes[c])));
  }
  (void)selected;
}

}  // namespace kolo::parallel::fed
