// joinMpiObservers: the flight recorder, the timeline and its clock alignment for ranks of an
// MPI job. Rank r sends rank 0 a ping at t0, rank 0 answers with its clock t1, and r reads the
// answer at t2: offset = t1 - (t0 + t2) / 2, within half the round trip of the truth.
#include "comm/mpi/mpi_observers.h"

#if KOLO_HAVE_MPI

#include <atomic>
#include <string>
#include <utility>

#include "comm/observers.h"
#include "kolo/flight_recorder.h"
#include "kolo/settings.h"
#include "kolo/trace.h"

namespace kolo::comm::detail {
namespace {

constexpr int kClockTag = 32767;  // MPI guarantees tags up to 32767

std::pair<int64_t, int64_t> alignClocksOverMpi(Communicator& world) {
  const int rank = world.rank();
  if (rank == 0) {
    for (int r = 1; r < world.size(); ++r) {
      for (int round = 0; round < kClockRounds; ++round) {
        int64_t ping = 0;
        world.recv(&ping, 1, DType::I64, r, kClockTag);
        const int64_t t1 = trace::nowNs();
        world.send(&t1, 1, DType::I64, r, kClockTag);
      }
    }
    return {0, 0};
  }
  int64_t bestOffset = 0, bestRoundTrip = -1;
  for (int round = 0; round < kClockRounds; ++round) {
    const int64_t t0 = trace::nowNs();
    world.send(&t0, 1, DType::I64, 0, kClockTag);
    int64_t t1 = 0;
    world.recv(&t1, 1, DType::I64, 0, kClockTag);
    const int64_t t2 = trace::nowNs();
    if (bestRoundTrip < 0 || t2 - t0 < bestRoundTrip) {
      bestRoundTrip = t2 - t0;
      bestOffset = t1 - (t0 + t2) / 2;
    }
  }
  return {bestOffset, bestRoundTrip};
}

}  // namespace

uint32_t joinMpiObservers(Communicator& world) {
  // World communicators made so far in this process; MPI_Comm_dup is collective, so every
  // rank counts alike.
  static std::atomic<uint32_t> worlds{0};
  const uint32_t index = worlds.fetch_add(1);
  if (index > 0) return 0x4d500000u | (index << 1);  // 'MP', never 1
  // Before the recorders start, so that the exchange itself is not recorded.
  const std::string timeline = settings::timeline();
  int32_t anyTimeline = !timeline.empty() || trace::enabled() ? 1 : 0;
  if (world.size() > 1) world.allreduce(&anyTimeline, &anyTimeline, 1, DType::I32, ReduceOp::Max);
  const auto [offset, roundTrip] =
      anyTimeline != 0 && world.size() > 1 ? alignClocksOverMpi(world) : std::pair<int64_t, int64_t>{0, 0};
  flight::attach(world.rank(), world.size());
  if (!timeline.empty() && !trace::enabled()) trace::start({.directory = timeline, .writeAtExit = true});
  trace::setRank(world.rank(), world.size());
  if (trace::enabled() && world.rank() != 0) trace::setClockOffset(offset, roundTrip);
  return 1;
}

}  // namespace kolo::comm::detail

#endif  // KOLO_HAVE_MPI
