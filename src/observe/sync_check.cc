// The weight-sync check: a 64-bit hash per tensor, all-gathered, and the ranks whose hashes
// leave the majority's named with the first tensor where they do (the check behind
// `kolo train --check-sync N`).
#include <algorithm>
#include <cstring>
#include <map>

#include "kolo/error.h"
#include "kolo/numerics.h"

namespace kolo::observe {
namespace {

// A word-at-a-time multiply-rotate hash (the mixing of xxHash's and MurmurHash's rounds):
// fast enough to run over the whole model every few steps, and every bit of the input
// reaches every bit of the state.
constexpr uint64_t kPrime1 = 0x9E3779B185EBCA87ULL;
constexpr uint64_t kPrime2 = 0xC2B2AE3D27D4EB4FULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t mix(uint64_t state, uint64_t word) {
  return rotl(state ^ (word * kPrime2), 31) * kPrime1;
}

uint64_t hashBytes(uint64_t state, const unsigned char* bytes, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, bytes + i, 8);
    state = mix(state, word);
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes + i, n - i);
  state = mix(state, tail ^ (static_cast<uint64_t>(n - i) << 56));
  // Final avalanche (MurmurHash3's fmix64).
  state ^= state >> 33;
  state *= 0xFF51AFD7ED558CCDULL;
  state ^= state >> 33;
  state *= 0xC4CEB9FE1A85EC53ULL;
  return state ^ (state >> 33);
}

std::string rankList(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += i + 1 == ranks.size() ? " and " : ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

}  // namespace

uint64_t tensorHash(const Tensor& values) {
  uint64_t state = mix(0, static_cast<uint64_t>(values.dtype()));
  for (int64_t d : values.shape()) state = mix(state, static_cast<uint64_t>(d));
  if (!values.defined() || values.numel() == 0) return hashBytes(state, nullptr, 0);
  const Tensor dense = values.contiguous();
  return hashBytes(state, static_cast<const unsigned char*>(dense.rawData()), dense.nbytes());
}

std::string SyncReport::describe() const {
  if (inSync())
    return detail::concat("weights in sync at step ", step, ": ", tensorCount, " tensors equal on ",
                          worldSize, " ranks");
  std::string text = detail::concat("weights out of sync at step ", step, ": ",
                                    rankList(divergedRanks), (divergedRanks.size() == 1 ? " differs" : " differ"));
  if (!agreeingRanks.empty()) text += " from " + rankList(agreeingRanks);
  if (agreeingRanks.size() > 1 && divergedRanks.size() < agreeingRanks.size())
    text += " (the majority)";
  return detail::concat(text, " in ", tensorsDiffering, " of ", tensorCount,
                        " tensors, the first '", firstTensor, "'");
}

SyncReport compareReplicas(comm::Communicator& comm,
                           const std::vector<std::pair<std::string, Tensor>>& tensors,
                           int64_t step) {
  const int size = comm.size();
  const size_t n = tensors.size();
  // First the counts, so that ranks holding different models get an error, not a
  // mismatched all-gather.
  const int64_t count = static_cast<int64_t>(n);
  std::vector<int64_t> counts(static_cast<size_t>(size));
  comm.allgather(&count, counts.data(), 1, DType::I64);
  for (int r = 0; r < size; ++r)
    KOLO_REQUIRE(counts[static_cast<size_t>(r)] == count, "weight-sync check at step ", step,
                 ": rank ", comm.rank(), " holds ", count, " tensors, rank ", r, " holds ",
                 counts[static_cast<size_t>(r)]);
  std::vector<uint64_t> mine(n);
  for (size_t i = 0; i < n; ++i) mine[i] = tensorHash(tensors[i].second);
  std::vector<uint64_t> all(n * static_cast<size_t>(size));
  if (n > 0) comm.allgather(mine.data(), all.data(), n, DType::I64);

  SyncReport report;
  report.step = step;
  report.worldSize = size;
  report.tensorCount = count;
  std::vector<bool> diverged(static_cast<size_t>(size), false);
  for (size_t i = 0; i < n; ++i) {
    // The reference hash: held by the most ranks; a tie goes to the lowest rank's.
    std::map<uint64_t, int> votes;
    for (int r = 0; r < size; ++r) ++votes[all[static_cast<size_t>(r) * n + i]];
    uint64_t reference = all[i];
    for (int r = 0; r < size; ++r) {
      const uint64_t h = all[static_cast<size_t>(r) * n + i];
      if (votes[h] > votes[reference]) reference = h;
    }
    bool differs = false;
    for (int r = 0; r < size; ++r) {
      if (all[static_cast<size_t>(r) * n + i] == reference) continue;
      diverged[static_cast<size_t>(r)] = true;
      differs = true;
    }
    if (!differs) continue;
    if (report.tensorsDiffering++ == 0) report.firstTensor = tensors[i].first;
  }
  for (int r = 0; r < size; ++r)
    (diverged[static_cast<size_t>(r)] ? report.divergedRanks : report.agreeingRanks).push_back(r);
  return report;
}

void checkReplicasInSync(comm::Communicator& comm,
                         const std::vector<std::pair<std::string, Tensor>>& tensors, int64_t step) {
  const SyncReport report = compareReplicas(comm, tensors, step);
  if (!report.inSync()) KOLO_THROW(ReplicaMismatch, report.describe());
}

}  // namespace kolo::observe
