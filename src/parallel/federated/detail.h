// Helpers shared by the federated sources: seed mixing and the store keys of the protocol.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kolo/comm/store.h"

namespace kolo::parallel::fed::detail {

/// A seed for one purpose and round derived from the job's seed (splitmix64 finaliser), so
/// that random streams do not overlap.
uint64_t mixSeed(uint64_t seed, uint64_t a, uint64_t b = 0);

/// "fed/round/<round>/<what>".
std::string roundKey(int64_t round, const std::string& what);

/// Waits until `prefix + id` exists for every id or `deadline` passes, whichever is first;
/// returns the values of the keys that were set (and removes them from the store). An empty
/// value says that client left (`announceLeave`): its id is settled and not returned.
std::map<int, comm::Bytes> collect(comm::Store& store, const std::string& prefix,
                                   const std::vector<int>& ids,
                                   std::chrono::steady_clock::time_point deadline);

/// Tells the server, waiting in `collect` on `key`, that the client will not send it.
void announceLeave(comm::Store& store, const std::string& key);

/// Little-endian writing and bounds-checked reading of a frame.
class Writer {
 public:
  template <class T>
  void put(const T& value) {
    putBytes(&value, sizeof(T));
  }
  void putBytes(const void* data, size_t size) {
    const size_t at = bytes.size();
    bytes.resize(at + size);
    if (size > 0) std::memcpy(bytes.data() + at, data, size);
  }
  comm::Bytes bytes;
};

class Reader {
 public:
  Reader(const comm::Bytes& bytes, std::string from) : bytes_(bytes), from_(std::move(from)) {}
  template <class T>
  T get() {
    T value;
    take(&value, sizeof(T));
    return value;
  }
  void take(void* out, size_t size);
  size_t left() const { return bytes_.size() - offset_; }
  /// Throws FormatError unless `count` items of `size` bytes remain.
  void expect(uint64_t count, size_t size, const char* what) const;
  const std::string& from() const { return from_; }

 private:
  const comm::Bytes& bytes_;
  size_t offset_ = 0;
  std::string from_;
};

}  // namespace kolo::parallel::fed::detail
