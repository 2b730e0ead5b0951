// How a training set is split over the simulated clients of a federated job (IID, McMahan's
// label shards, Dirichlet label skew) and which clients a round samples; both are seeded
// functions, so every process of a job computes the same answer.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numeric>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"
#include "parallel/federated/detail.h"

namespace kolo::parallel::fed {
namespace {

using detail::mixSeed;

template <class T>
void shuffle(std::vector<T>& values, Generator& generator) {
  for (size_t i = values.size(); i > 1; --i) {
    const size_t j = static_cast<size_t>(generator.nextU64() % i);
    std::swap(values[i - 1], values[j]);
  }
}

// Gamma(shape, 1) by Marsaglia and Tsang (2000); shape < 1 through Gamma(shape + 1) U^(1/shape).
double sampleGamma(double shape, Generator& generator) {
  if (shape < 1.0) {
    const double u = std::max(generator.uniform(), 1e-300);
    return sampleGamma(shape + 1.0, generator) * std::pow(u, 1.0 / shape);
  }
  const double d = shape - 1.0 / 3.0;
  const double c = 1.0 / std::sqrt(9.0 * d);
  for (;;) {
    double x = 0.0, v = 0.0;
    do {
      x = generator.normal();
      v = 1.0 + c * x;
    } while (v <= 0.0);
    v = v * v * v;
    const double u = generator.uniform();
    if (u < 1.0 - 0.0331 * x * x * x * x) return d * v;
    if (std::log(std::max(u, 1e-300)) < 0.5 * x * x + d * (1.0 - v + std::log(v))) return d * v;
  }
}

}  // namespace

namespace detail {
uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b) {
  uint64_t z = seed ^ (a * 0x9e3779b97f4a7c15ULL) ^ (b * 0xbf58476d1ce4e5b9ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace detail

PartitionSpec parsePartition(const std::string& text) {
  PartitionSpec spec;
  const size_t colon = text.find(':');
  const std::string kind = text.substr(0, colon);
  const std::string value = colon == std::string::npos ? "" : text.substr(colon + 1);
  try {
    if (kind == "iid" && colon == std::string::npos) {
      spec.kind = PartitionSpec::Kind::Iid;
      return spec;
    }
    size_t used = 0;
    if (kind == "shards" && !value.empty()) {
      spec.kind = PartitionSpec::Kind::Shards;
      spec.shards = std::stoi(value, &used);
      if (used == value.size() && spec.shards >= 1) return spec;
    } else if (kind == "dirichlet" && !value.empty()) {
      spec.kind = PartitionSpec::Kind::Dirichlet;
      spec.alpha = std::stod(value, &used);
      if (used == value.size() && spec.alpha > 0 && std::isfinite(spec.alpha)) return spec;
    }
  } catch (const std::exception&) {
  }
  KOLO_THROW(InvalidArgument, "parsePartition '", text,
             "' is not accepted: use iid, shards:S (S >= 1) or dirichlet:ALPHA (ALPHA > 0)");
}

namespace {

// The split of `n` samples; `labels` (the n labels) is read only by the label-skewed kinds.
std::vector<std::vector<int64_t>> partition(int64_t n, const std::function<std::vector<double>()>& labels,
                                            int clients, const PartitionSpec& spec, uint64_t seed) {
  KOLO_REQUIRE(clients >= 1, "federated: FederatedOptions::clients must be at least 1, got ", clients);
  KOLO_REQUIRE(n >= clients, "federated: ", n, " training samples cannot be split over ", clients,
               " clients");
  Generator generator(mixSeed(seed, 0x9a27));
  std::vector<std::vector<int64_t>> parts(static_cast<size_t>(clients));
  if (spec.kind == PartitionSpec::Kind::Iid) {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    shuffle(order, generator);
    for (int c = 0; c < clients; ++c)
      parts[c].assign(order.begin() + n * c / clients, order.begin() + n * (c + 1) / clients);
    return parts;
  }
  const std::vector<double> y = labels();
  if (spec.kind == PartitionSpec::Kind::Shards) {
    const int64_t shards = static_cast<int64_t>(clients) * spec.shards;
    KOLO_REQUIRE(n >= shards, "federated: PartitionSpec::shards ", spec.shards, " needs ", shards,
                 " shards but there are only ", n, " training samples");
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&y](int64_t a, int64_t b) { return y[a] < y[b]; });
    std::vector<int64_t> shardIds(static_cast<size_t>(shards));
    std::iota(shardIds.begin(), shardIds.end(), 0);
    shuffle(shardIds, generator);
    for (int c = 0; c < clients; ++c) {
      for (int s = 0; s < spec.shards; ++s) {
        const int64_t shard = shardIds[static_cast<size_t>(c) * spec.shards + s];
        parts[c].insert(parts[c].end(), order.begin() + n * shard / shards,
                        order.begin() + n * (shard + 1) / shards);
      }
    }
    return parts;
  }
  // Dirichlet: every class is dealt out in proportions p ~ Dir(alpha) over the clients.
  std::map<int64_t, std::vector<int64_t>> byClass;
  for (int64_t i = 0; i < n; ++i) byClass[static_cast<int64_t>(y[i])].push_back(i);
  for (auto& [label, members] : byClass) {
    shuffle(members, generator);
    std::vector<double> p(static_cast<size_t>(clients));
    double total = 0;
    for (double& v : p) total += (v = sampleGamma(spec.alpha, generator));
    const int64_t m = static_cast<int64_t>(members.size());
    double cumulative = 0;
    int64_t begin = 0;
    for (int c = 0; c < clients; ++c) {
      cumulative += p[c];
      const int64_t end =
          c + 1 == clients ? m : std::min<int64_t>(m, std::llround(m * cumulative / total));
      parts[c].insert(parts[c].end(), members.begin() + begin,
                      members.begin() + std::max(begin, end));
      begin = std::max(begin, end);
    }
  }
  for (auto& part : parts) {
    if (!part.empty()) continue;
    auto largest = std::max_element(parts.begin(), parts.end(), [](const auto& a, const auto& b) {
      return a.size() < b.size();
    });
    part.push_back(largest->back());
    largest->pop_back();
  }
  for (auto& part : parts) std::sort(part.begin(), part.end());
  return parts;
}

}  // namespace

std::vector<std::vector<int64_t>> partitionClients(const Tensor& labels, int clients,
                                                   const PartitionSpec& spec, uint64_t seed) {
  return partition(labels.numel(), [&labels] { return labels.toDoubleVector(); }, clients, spec, seed);
}

std::vector<std::vector<int64_t>> partitionClients(const data::Dataset& data, int clients,
                                                   const PartitionSpec& spec, uint64_t seed) {
  const int64_t n = data.size();
  const auto labels = [&data, n] {
    std::vector<double> y;
    y.reserve(static_cast<size_t>(n));
    std::vector<int64_t> ids;
    for (int64_t begin = 0; begin < n; begin += kLabelChunk) {
      ids.resize(static_cast<size_t>(std::min(kLabelChunk, n - begin)));
      std::iota(ids.begin(), ids.end(), begin);
      const std::vector<double> chunk = data.gather(ids).labels.toDoubleVector();
      KOLO_REQUIRE(chunk.size() == ids.size(), "federated: the training dataset gave ", chunk.size(),
                   " labels for its samples ", begin, "..", begin + static_cast<int64_t>(ids.size()) - 1);
      y.insert(y.end(), chunk.begin(), chunk.end());
    }
    return y;
  };
  return partition(n, labels, clients, spec, seed);
}

std::vector<int> sampleClients(int clients, int perRound, int64_t round, uint64_t seed) {
  KOLO_REQUIRE(perRound >= 1 && perRound <= clients,
               "federated: FederatedOptions::clientsPerRound must be in [1, ", clients, "], got ", perRound);
  Generator generator(mixSeed(seed, 0x5a3b1e, static_cast<uint64_t>(round)));
  std::vector<int> ids(static_cast<size_t>(clients));
  std::iota(ids.begin(), ids.end(), 0);
  // Partial Fisher-Yates: the first perRound entries are a uniform sample without replacement.
  for (int i = 0; i < perRound; ++i) {
    const int j = i + static_cast<int>(generator.nextU64() % static_cast<uint64_t>(clients - i));
    std::swap(ids[i], ids[j]);
  }
  ids.resize(static_cast<size_t>(perRound));
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace kolo::parallel::fed
