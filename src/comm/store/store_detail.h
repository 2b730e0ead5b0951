// Helpers shared by the Store implementations: argument limits, the integer encoding that
// `add` uses (decimal text, so `get` of a counter is readable) and the Timeout message.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "kolo/comm/store.h"

namespace kolo::comm::detail {

/// Throws InvalidArgument when key is empty or longer than kMaxStoreKeyBytes.
void checkStoreKey(const std::string& key);
/// Throws InvalidArgument when value is larger than kMaxStoreValueBytes.
void checkStoreValue(const std::string& key, const Bytes& value);

/// The integer a counter value holds (empty = 0); throws InvalidArgument naming the key
/// when the value is not decimal text.
int64_t parseCounter(const std::string& key, const Bytes& value);
Bytes encodeCounter(int64_t value);
/// The counter after `add`: the integer in *current (nullptr: a missing key, 0) plus delta.
/// Throws InvalidArgument naming the key when the value is not decimal text or the sum
/// does not fit in int64.
int64_t addToCounter(const std::string& key, const Bytes* current, int64_t delta);

/// Throws Timeout: "store <what>: timed out after N ms waiting for key(s) 'a', 'b'".
[[noreturn]] void throwStoreTimeout(const std::string& what,
                                    const std::vector<std::string>& missing, Millis timeout);

/// Steady-clock deadline `timeout` from now, saturating instead of overflowing.
std::chrono::steady_clock::time_point deadlineAfter(Millis timeout);

}  // namespace kolo::comm::detail
