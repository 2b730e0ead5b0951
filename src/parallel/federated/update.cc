// A client's update on the wire (a checked frame), the server's weighted sum that refuses
// bad updates with a message naming the client, and the store helpers of the protocol.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "kolo/error.h"
#include "kolo/parallel/federated.h"
#include "parallel/federated/detail.h"

namespace kolo::parallel::fed {
namespace {

constexpr uint32_t kUpdateMagic = 0x4b464431;  // "KFD1"
// Larger than any model kolo builds; a count above it is a malformed frame, not an allocation.
constexpr uint64_t kMaxValues = uint64_t{1} << 28;

}  // namespace

namespace detail {

std::string roundKey(int64_t round, const std::string& what) {
  return "fed/round/" + std::to_string(round) + "/" + what;
}

std::map<int, comm::Bytes> collect(comm::Store& store, const std::string& prefix,
                                   const std::vector<int>& ids,
                                   std::chrono::steady_clock::time_point deadline) {
  // The store cannot wait for "any of" several keys: wait for each pending key in turn for
  // a short slice, so keys that are there are taken at once whatever the order, and the
  // round ends when all arrived or the deadline passed.
  constexpr auto kSlice = std::chrono::milliseconds(20);
  std::map<int, comm::Bytes> got;
  std::vector<int> pending = ids;
  auto take = [&](int id, comm::Bytes bytes) {
    if (!bytes.empty()) got[id] = std::move(bytes);  // empty: the client left
  };
  for (bool first = true; !pending.empty(); first = false) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0 && !first) break;
    std::vector<int> still;
    for (int id : pending) {
      const std::string key = prefix + std::to_string(id);
      try {
        if (store.check({key})) {
          take(id, store.get(key, std::chrono::seconds(10)));
        } else {
          const auto now = std::chrono::steady_clock::now();
          const auto wait = std::min<std::chrono::milliseconds>(
              kSlice, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
          if (wait.count() <= 0) {
            still.push_back(id);
            continue;
          }
          take(id, store.get(key, wait));
        }
        store.remove(key);
      } catch (const Timeout&) {
        still.push_back(id);  // not yet
      }
    }
    pending = std::move(still);
  }
  return got;
}

void announceLeave(comm::Store& store, const std::string& key) { store.set(key, comm::Bytes{}); }

void Reader::take(void* out, size_t size) {
  if (left() < size)
    KOLO_THROW(FormatError, from_, ": the frame ends after ", bytes_.size(), " bytes, ", size,
               " more were expected");
  std::memcpy(out, bytes_.data() + offset_, size);
  offset_ += size;
}

void Reader::expect(uint64_t count, size_t size, const char* what) const {
  if (count > kMaxValues || count * size != left())
    KOLO_THROW(FormatError, from_, ": the frame announces ", count, " ", what, " but holds ",
               left(), " bytes");
}

}  // namespace detail

comm::Bytes encodeUpdate(const Update& update) {
  detail::Writer w;
  w.put(kUpdateMagic);
  w.put(update.round);
  w.put(update.client);
  w.put(update.samples);
  w.put(static_cast<uint64_t>(update.delta.size()));
  w.putBytes(update.delta.data(), update.delta.size() * sizeof(float));
  return std::move(w.bytes);
}

Update decodeUpdate(const comm::Bytes& bytes, const std::string& from) {
  detail::Reader r(bytes, from);
  if (r.get<uint32_t>() != kUpdateMagic)
    KOLO_THROW(FormatError, from, ": not a federated update frame (wrong magic)");
  Update update;
  update.round = r.get<int64_t>();
  update.client = r.get<int32_t>();
  update.samples = r.get<int64_t>();
  const uint64_t count = r.get<uint64_t>();
  r.expect(count, sizeof(float), "values");
  update.delta.resize(count);
  r.take(update.delta.data(), count * sizeof(float));
  return update;
}

Aggregator::Aggregator(int64_t round, size_t parameters) : round_(round), sum_(parameters, 0.0) {}

void Aggregator::check(const Update& update) const {
  const std::string who = "client " + std::to_string(update.client);
  if (update.round != round_)
    KOLO_THROW(Mismatch, who, " sent an update for round ", update.round, " in round ", round_,
               update.round < round_ ? " (stale)" : " (ahead)", "; refused");
  if (update.delta.size() != sum_.size())
    KOLO_THROW(Mismatch, who, " sent an update of ", update.delta.size(), " values, the model has ",
               sum_.size(), "; refused");
  for (size_t i = 0; i < update.delta.size(); ++i) {
    if (!std::isfinite(update.delta[i]))
      KOLO_THROW(InvalidArgument, who, " sent a non-finite value (", update.delta[i],
                 ") at element ", i, " of its update; refused");
  }
  if (update.samples < 1)
    KOLO_THROW(InvalidArgument, who, " reported ", update.samples, " samples; refused");
  for (int32_t seen : clients_) {
    if (seen == update.client)
      KOLO_THROW(Mismatch, who, " sent a second update in round ", round_, "; refused");
  }
}

void Aggregator::add(const Update& update) {
  check(update);
  const double weight = static_cast<double>(update.samples);
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += weight * update.delta[i];
  weight_ += weight;
  clients_.push_back(update.client);
}

void Aggregator::addUnweighted(const Update& update) {
  check(update);
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += update.delta[i];
  weight_ += 1.0;
  clients_.push_back(update.client);
}

std::vector<float> Aggregator::mean() const {
  std::vector<float> out(sum_.size(), 0.0f);
  if (weight_ <= 0.0) return out;
  for (size_t i = 0; i < sum_.size(); ++i) out[i] = static_cast<float>(sum_[i] / weight_);
  return out;
}

}  // namespace kolo::parallel::fed
