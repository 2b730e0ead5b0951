// Rendezvous key-value store: how ranks find each other and agree on small facts.
// Implementations: in-memory (ranks as threads), file (shared directory), TCP (a server
// hosted by `kolo run` or rank 0, with a job token). All waits have deadlines.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kolo::comm {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  /// Sets key to value (overwrites).
  virtual void set(const std::string& key, const Bytes& value) = 0;
  /// Returns the value of key, waiting up to `timeout` for it to be set; throws Timeout
  /// naming the key otherwise.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  /// Waits until every key exists; throws Timeout naming the missing keys.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  /// Atomically adds delta to the integer stored at key (missing = 0); returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  /// Removes key; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
  /// True when every key exists (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;

  // Bulk operations. Each has a default made of the operations above; a store that can do
  // better (the TCP store: one request, one reply) overrides it, so that the control
  // plane's requests grow with the ranks, not with their square.

  /// Waits until every key exists, up to `timeout` (Timeout naming the missing keys
  /// otherwise), and returns their values in the order of `keys`.
  virtual std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Millis timeout);
  /// Sets keys[i] to values[i] for every i; InvalidArgument when the counts differ.
  virtual void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values);
  /// For each key, whether it exists now (does not wait).
  virtual std::vector<bool> checkEach(const std::vector<std::string>& keys);
  /// Counter barrier: adds 1 to the counter at `key` and returns once the counter has
  /// reached `count`, with the counter's value after this arrival (1 for the first). Waits
  /// up to `timeout`; Timeout naming the key otherwise (the arrival still counts). The
  /// default opens the barrier with a second key, KEY/open.
  virtual int64_t arrive(const std::string& key, int64_t count, Millis timeout);

  void setString(const std::string& key, const std::string& value) {
    set(key, Bytes(value.begin(), value.end()));
  }
  std::string getString(const std::string& key, Millis timeout) {
    Bytes b = get(key, timeout);
    return std::string(b.begin(), b.end());
  }
};

/// Wraps a store so every key is prefixed (sub-groups, separate jobs on one server).
std::shared_ptr<Store> prefixStore(std::shared_ptr<Store> base, const std::string& prefix);

}  // namespace kolo::comm
