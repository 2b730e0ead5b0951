// Ranks as threads over the native communicator and an in-memory store, for tests that
// need what only a real backend gives (several-algorithm all-reduce, shared windows).
#pragma once

#include <chrono>
#include <functional>
#include <memory>

#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"

namespace kolo::parallel::testing {

/// A function that builds rank r's communicator of an n-rank job (call it on n threads).
inline std::function<std::shared_ptr<comm::Communicator>(int)> nativeRanks(
    int n, std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = comm::makeMemoryStore();
  return [store, n, timeout](int rank) {
    comm::NativeOptions options;
    options.timeout = timeout;
    return comm::createNativeCommunicator(store, rank, n, options);
  };
}

}  // namespace kolo::parallel::testing
