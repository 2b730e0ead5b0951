// joinObservers and the NTP-style clock exchange through the store. Rank r sends a ping
// (a key) at t0, rank 0 answers with its clock t1 as soon as the store hands it the ping,
// and r reads the answer at t2: offset = t1 - (t0 + t2) / 2, within half the round trip
// t2 - t0 of the truth; the round with the shortest round trip is kept.
#include "comm/observers.h"

#include <string>
#include <utility>
#include <vector>

#include "kolo/error.h"
#include "kolo/flight_recorder.h"
#include "kolo/settings.h"
#include "kolo/trace.h"

namespace kolo::comm::detail {

std::pair<int64_t, int64_t> alignClocks(Store& store, const std::string& prefix, int rank, int size, bool measure,
                                        std::chrono::milliseconds timeout) {
  const std::string base = prefix + "timeline/";
  store.setString(base + std::to_string(rank), measure ? "1" : "0");
  auto key = [&](int r, int round, const char* what) {
    return base + std::to_string(r) + "/" + std::to_string(round) + "/" + what;
  };
  if (rank == 0) {
    // Who measures, in one request: rank 0 answers those ranks only.
    std::vector<std::string> keys;
    for (int r = 1; r < size; ++r) keys.push_back(base + std::to_string(r));
    const std::vector<Bytes> measuring = store.multiGet(keys, timeout);
    for (int r = 1; r < size; ++r) {
      if (measuring[static_cast<size_t>(r - 1)] != Bytes{'1'}) continue;
      for (int round = 0; round < kClockRounds; ++round) {
        store.getString(key(r, round, "ping"), timeout);
        store.setString(key(r, round, "pong"), std::to_string(trace::nowNs()));
      }
    }
    return {0, 0};
  }
  if (!measure) return {0, 0};
  int64_t bestOffset = 0, bestRoundTrip = -1;
  for (int round = 0; round < kClockRounds; ++round) {
    const int64_t t0 = trace::nowNs();
    store.setString(key(rank, round, "ping"), "1");
    const std::string answer = store.getString(key(rank, round, "pong"), timeout);
    const int64_t t2 = trace::nowNs();
    int64_t t1 = 0;
    try {
      t1 = std::stoll(answer);
    } catch (const std::exception&) {
      KOLO_THROW(FormatError, "timeline clock exchange: rank 0 answered '", answer, "', not a time");
    }
    if (bestRoundTrip < 0 || t2 - t0 < bestRoundTrip) {
      bestRoundTrip = t2 - t0;
      bestOffset = t1 - (t0 + t2) / 2;
    }
  }
  return {bestOffset, bestRoundTrip};
}

void joinObservers(Store& store, const std::string& prefix, int rank, int size, std::chrono::milliseconds timeout) {
  flight::attach(rank, size);
  const std::string timeline = settings::timeline();
  if (!timeline.empty() && !trace::enabled())
    trace::start({.directory = timeline, .writeAtExit = true});
  trace::setRank(rank, size);
  if (size == 1) return;
  const auto [offset, roundTrip] = alignClocks(store, prefix, rank, size, trace::enabled(), timeout);
  if (trace::enabled()) trace::setClockOffset(offset, roundTrip);
}

}  // namespace kolo::comm::detail
