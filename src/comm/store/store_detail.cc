// Helpers shared by the Store implementations (limits, counter encoding, timeouts) and
// prefixStore, the key-prefixing wrapper declared in store.h.
#include "comm/store/store_detail.h"

#include <charconv>
#include <sstream>

#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace detail {

void checkStoreKey(const std::string& key) {
  if (key.empty()) KOLO_THROW(InvalidArgument, "store: empty key");
  if (key.size() > kMaxStoreKeyBytes)
    KOLO_THROW(InvalidArgument, "store: key of ", key.size(), " bytes exceeds the limit of ",
               kMaxStoreKeyBytes, " (key starts '", key.substr(0, 64), "')");
}

void checkStoreValue(const std::string& key, const Bytes& value) {
  if (value.size() > kMaxStoreValueBytes)
    KOLO_THROW(InvalidArgument, "store: value of ", value.size(), " bytes for key '", key,
               "' exceeds the limit of ", kMaxStoreValueBytes);
}

int64_t parseCounter(const std::string& key, const Bytes& value) {
  if (value.empty()) return 0;
  const char* begin = reinterpret_cast<const char*>(value.data());
  const char* end = begin + value.size();
  int64_t result = 0;
  auto [ptr, ec] = std::from_chars(begin, end, result);
  if (ec != std::errc() || ptr != end)
    KOLO_THROW(InvalidArgument, "store: add on key '", key, "' whose value '",
               std::string(begin, std::min<size_t>(value.size(), 64)), "' is not an integer");
  return result;
}

int64_t addToCounter(const std::string& key, const Bytes* current, int64_t delta) {
  const int64_t value = current ? parseCounter(key, *current) : 0;
  int64_t result = 0;
  if (__builtin_add_overflow(value, delta, &result))
    KOLO_THROW(InvalidArgument, "store: add of ", delta, " to key '", key, "' holding ", value,
               " overflows int64");
  return result;
}

Bytes encodeCounter(int64_t value) {
  std::string text = std::to_string(value);
  return Bytes(text.begin(), text.end());
}

void throwStoreTimeout(const std::string& what, const std::vector<std::string>& missing,
                       Millis timeout) {
  std::ostringstream out;
  out << "store " << what << ": timed out after " << timeout.count() << " ms waiting for key"
      << (missing.size() == 1 ? " " : "s ");
  for (size_t i = 0; i < missing.size(); ++i) out << (i ? ", '" : "'") << missing[i] << "'";
  throw Timeout(out.str());
}

std::chrono::steady_clock::time_point deadlineAfter(Millis timeout) {
  auto now = std::chrono::steady_clock::now();
  auto room =
      std::chrono::duration_cast<Millis>(std::chrono::steady_clock::time_point::max() - now);
  if (timeout >= room) return std::chrono::steady_clock::time_point::max();
  if (timeout.count() < 0) return now;
  return now + timeout;
}

}  // namespace detail

std::vector<Bytes> Store::multiGet(const std::vector<std::string>& keys, Millis timeout) {
  wait(keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key, timeout));
  return values;
}

void Store::multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  if (keys.size() != values.size())
    KOLO_THROW(InvalidArgument, "store multiSet: ", keys.size(), " keys but ", values.size(), " values");
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

std::vector<bool> Store::checkEach(const std::vector<std::string>& keys) {
  std::vector<bool> present;
  present.reserve(keys.size());
  for (const auto& key : keys) present.push_back(check({key}));
  return present;
}

int64_t Store::arrive(const std::string& key, int64_t count, Millis timeout) {
  const int64_t arrival = add(key, 1);
  if (arrival >= count) setString(key + "/open", "1");
  wait({key + "/open"}, timeout);
  return arrival;
}

namespace {

/// Forwards every call with `prefix/` in front of each key.
class PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> base, std::string prefix)
      : base_(std::move(base)), prefix_(std::move(prefix)) {
    if (!base_)
      KOLO_THROW(InvalidArgument, "prefixStore: null base store (prefix '", prefix_, "')");
  }
  void set(const std::string& key, const Bytes& value) override { base_->set(full(key), value); }
  Bytes get(const std::string& key, Millis timeout) override {
    return base_->get(full(key), timeout);
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    base_->wait(full(keys), timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return base_->add(full(key), delta);
  }
  bool remove(const std::string& key) override { return base_->remove(full(key)); }
  bool check(const std::vector<std::string>& keys) override { return base_->check(full(keys)); }
  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Millis timeout) override {
    return base_->multiGet(full(keys), timeout);
  }
  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    base_->multiSet(full(keys), values);
  }
  std::vector<bool> checkEach(const std::vector<std::string>& keys) override {
    return base_->checkEach(full(keys));
  }
  int64_t arrive(const std::string& key, int64_t count, Millis timeout) override {
    return base_->arrive(full(key), count, timeout);
  }

 private:
  std::string full(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> full(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(full(k));
    return out;
  }
  std::shared_ptr<Store> base_;
  std::string prefix_;
};

}  // namespace

std::shared_ptr<Store> prefixStore(std::shared_ptr<Store> base, const std::string& prefix) {
  return std::make_shared<PrefixStore>(std::move(base), prefix);
}

}  // namespace kolo::comm
