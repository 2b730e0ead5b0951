// The in-memory Store: a map under one mutex, with a condition variable that wakes
// waiters whenever a key is set or added. Used when ranks are threads of one process.
#include <condition_variable>
#include <map>
#include <mutex>

#include "comm/store/store_detail.h"
#include "kolo/comm/stores.h"

namespace kolo::comm {
namespace {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    detail::checkStoreKey(key);
    detail::checkStoreValue(key, value);
    {
      std::lock_guard lock(mutex_);
      values_[key] = value;
    }
    changed_.notify_all();
  }

  Bytes get(const std::string& key, Millis timeout) override {
    detail::checkStoreKey(key);
    std::unique_lock lock(mutex_);
    auto deadline = detail::deadlineAfter(timeout);
    auto found = values_.end();
    bool ok = changed_.wait_until(lock, deadline, [&] {
      found = values_.find(key);
      return found != values_.end();
    });
    if (!ok) detail::throwStoreTimeout("memory get", {key}, timeout);
    return found->second;
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    for (const auto& key : keys) detail::checkStoreKey(key);
    std::unique_lock lock(mutex_);
    auto deadline = detail::deadlineAfter(timeout);
    if (!changed_.wait_until(lock, deadline, [&] { return missingLocked(keys).empty(); }))
      detail::throwStoreTimeout("memory wait", missingLocked(keys), timeout);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    detail::checkStoreKey(key);
    int64_t result = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = values_.find(key);
      result = detail::addToCounter(key, it == values_.end() ? nullptr : &it->second, delta);
      values_[key] = detail::encodeCounter(result);
    }
    changed_.notify_all();
    return result;
  }

  bool remove(const std::string& key) override {
    detail::checkStoreKey(key);
    std::lock_guard lock(mutex_);
    return values_.erase(key) > 0;
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) detail::checkStoreKey(key);
    std::lock_guard lock(mutex_);
    return missingLocked(keys).empty();
  }

 private:
  std::vector<std::string> missingLocked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& key : keys)
      if (!values_.count(key)) missing.push_back(key);
    return missing;
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes> values_;
};

}  // namespace

std::shared_ptr<Store> makeMemoryStore() { return std::make_shared<MemoryStore>(); }

}  // namespace kolo::comm
