// Soak run of the native communicator: N forked ranks (default 4) over a file store run
// COUNT collectives drawn at random from one shared seed (every collective of Communicator,
// every dtype, op and algorithm, 0 to 4 MiB, in place or not, any root) and check each
// result against closed-form values; optionally one rank sleeps before some calls.
// Usage: soak [--count N] [--ranks N] [--seed S] [--max-bytes B] [--hosts H]
//             [--delay-rank R] [--delay-percent P] [--delay-max-ms M] [--timeout-s T]
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/benchmark_case.h"
#include "comm/closed_form.h"
#include "kolo/comm/benchmark.h"
#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace {

using namespace kolo;
using comm::Algorithm;
using comm::ReduceOp;
using comm::detail::closedFormCode;
using comm::detail::kClosedFormSentinel;
using Clock = std::chrono::steady_clock;

struct SoakOptions {
  long count = 100000;
  int ranks = 4;
  uint64_t seed = 1;
  size_t maxBytes = size_t{4} << 20;
  int hosts = 1;
  int delayRank = -1;
  double delayPercent = 2;
  int delayMaxMs = 50;
  int timeoutSeconds = 300;
};

// The 8 collectives of comm::benchmarkCollective (checked by its BenchmarkCase) come first; then the
// non-blocking ones, allgatherv, split and barrier, checked here.
enum class Kind { Allreduce, Reduce, Broadcast, Allgather, ReduceScatter, Alltoall, Gather, Scatter,
                  Iallreduce, Ibroadcast, Allgatherv, Split, Barrier };
constexpr int kKinds = 13;
static_assert(static_cast<int>(Kind::Scatter) == static_cast<int>(comm::Collective::Scatter) &&
              static_cast<int>(Kind::Reduce) == static_cast<int>(comm::Collective::Reduce));
constexpr const char* kKindNames[kKinds] = {"allreduce", "reduce",     "broadcast",  "allgather", "reducescatter",
                                            "alltoall",  "gather",     "scatter",    "iallreduce", "ibroadcast",
                                            "allgatherv", "split",     "barrier"};
constexpr Algorithm kAlgorithms[] = {Algorithm::Auto, Algorithm::Ring, Algorithm::HalvingDoubling, Algorithm::Tree,
                                     Algorithm::ReduceBroadcast, Algorithm::Hierarchical};

/// One call, as every rank draws it from the shared sequence.
struct Draw {
  Kind kind;
  DType dtype;
  ReduceOp op;
  Algorithm algorithm;
  int root;
  bool inPlace;
  size_t bytes;
  int inFlight;  // non-blocking operations started before the first wait
};

/// Sizes: one call in 16 is empty, the rest log-uniform in [1, maxBytes], so small and
/// large messages both come up often.
size_t drawBytes(std::mt19937_64& rng, size_t maxBytes) {
  if (rng() % 16 == 0 || maxBytes == 0) return 0;
  std::uniform_real_distribution<double> exponent(0.0, std::log2(static_cast<double>(maxBytes) + 1));
  return std::min(maxBytes, static_cast<size_t>(std::exp2(exponent(rng))));
}

Draw drawCall(std::mt19937_64& rng, const SoakOptions& o) {
  Draw d;
  d.kind = static_cast<Kind>(rng() % kKinds);
  d.dtype = comm::detail::kAllDTypes[rng() % std::size(comm::detail::kAllDTypes)];
  d.op = comm::detail::kAllReduceOps[rng() % std::size(comm::detail::kAllReduceOps)];
  d.algorithm = kAlgorithms[rng() % std::size(kAlgorithms)];
  d.root = static_cast<int>(rng() % static_cast<uint64_t>(o.ranks));
  d.inPlace = rng() % 2 == 0;
  d.bytes = drawBytes(rng, o.maxBytes);
  d.inFlight = 1 + static_cast<int>(rng() % 3);
  return d;
}

std::string describe(const Draw& d) {
  char text[200];
  std::snprintf(text, sizeof text, "%s %s %s %s root %d %zu B %s%s", kKindNames[static_cast<int>(d.kind)],
                dtypeName(d.dtype), comm::reduceOpName(d.op), comm::algorithmName(d.algorithm), d.root, d.bytes,
                d.inPlace ? "in place" : "out of place",
                d.kind == Kind::Iallreduce || d.kind == Kind::Ibroadcast
                    ? (" x" + std::to_string(d.inFlight) + " in flight").c_str()
                    : "");
  return text;
}

/// iallreduce: `inFlight` operations started back to back, waited in order.
bool runIallreduce(comm::Communicator& comm, const Draw& d, const comm::CollectiveOptions& opts) {
  const size_t count = d.bytes / dtypeSize(d.dtype);
  const size_t bytes = count * dtypeSize(d.dtype) + 1;
  std::vector<std::vector<uint8_t>> send(d.inFlight, std::vector<uint8_t>(bytes)), recv = send;
  std::vector<std::unique_ptr<comm::Work>> work;
  for (int k = 0; k < d.inFlight; ++k) {
    comm::detail::fillClosedFormInput(send[k].data(), d.dtype, count, d.op, comm.rank(), comm.size(), k);
    void* out = d.inPlace ? send[k].data() : recv[k].data();
    work.push_back(comm.iallreduce(send[k].data(), out, count, d.dtype, d.op, opts));
  }
  bool ok = true;
  for (int k = 0; k < d.inFlight; ++k) {
    work[k]->wait();
    const void* out = d.inPlace ? send[k].data() : recv[k].data();
    ok = ok && comm::detail::closedFormMismatch(out, d.dtype, count, d.op, comm.size(), k).empty();
  }
  return ok;
}

/// ibroadcast: `inFlight` broadcasts from the same root started back to back.
bool runIbroadcast(comm::Communicator& comm, const Draw& d, const comm::CollectiveOptions& opts) {
  const size_t count = d.bytes / dtypeSize(d.dtype);
  std::vector<std::vector<uint8_t>> bufs(d.inFlight, std::vector<uint8_t>(count * dtypeSize(d.dtype) + 1));
  std::vector<std::unique_ptr<comm::Work>> work;
  for (int k = 0; k < d.inFlight; ++k) {
    for (size_t i = 0; i < count; ++i)
      storeElement(d.dtype, bufs[k].data(), i,
                   comm.rank() == d.root ? closedFormCode(d.root + k, 0, i) : kClosedFormSentinel);
    work.push_back(comm.ibroadcast(bufs[k].data(), count, d.dtype, d.root, opts));
  }
  bool ok = true;
  for (int k = 0; k < d.inFlight; ++k) {
    work[k]->wait();
    for (size_t i = 0; i < count && ok; ++i)
      ok = loadElement(d.dtype, bufs[k].data(), i) == closedFormCode(d.root + k, 0, i);
  }
  return ok;
}

/// allgatherv: each rank's count drawn from the shared sequence (zero included).
bool runAllgatherv(comm::Communicator& comm, const Draw& d, std::mt19937_64& rng,
                   const comm::CollectiveOptions& opts) {
  const int n = comm.size();
  const size_t esize = dtypeSize(d.dtype);
  const size_t most = d.bytes / (esize * static_cast<size_t>(n));
  std::vector<size_t> counts(n), offsets(n);
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    counts[r] = most == 0 ? 0 : rng() % (most + 1);
    offsets[r] = total;
    total += counts[r];
  }
  const int me = comm.rank();
  std::vector<uint8_t> recv(total * esize + 1), send(counts[me] * esize + 1);
  for (size_t i = 0; i < total; ++i) storeElement(d.dtype, recv.data(), i, kClosedFormSentinel);
  // In place: this rank's block already sits at its offset in the receive buffer.
  uint8_t* mine = d.inPlace ? recv.data() + offsets[me] * esize : send.data();
  for (size_t i = 0; i < counts[me]; ++i) storeElement(d.dtype, mine, i, closedFormCode(me, 0, i));
  comm.allgatherv(mine, recv.data(), counts, d.dtype, opts);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < counts[r]; ++i)
      if (loadElement(d.dtype, recv.data(), offsets[r] + i) != closedFormCode(r, 0, i)) return false;
  return true;
}

/// split: colors drawn from the shared sequence (a negative one leaves a rank out), then a
/// sum of ones over each new group must be its size.
bool runSplit(comm::Communicator& comm, std::mt19937_64& rng) {
  const int n = comm.size();
  std::vector<int> colors(n);
  for (int r = 0; r < n; ++r) colors[r] = static_cast<int>(rng() % 3) - 1;
  auto sub = comm.split(colors[comm.rank()], n - comm.rank());
  if (colors[comm.rank()] < 0) return sub == nullptr;
  const int want = static_cast<int>(std::count(colors.begin(), colors.end(), colors[comm.rank()]));
  if (!sub || sub->size() != want) return false;
  int32_t ones = 1;
  sub->allreduce(&ones, &ones, 1, DType::I32, ReduceOp::Sum);
  return ones == want;
}

bool runOne(comm::Communicator& comm, const Draw& d, std::mt19937_64& rng) {
  comm::CollectiveOptions opts;
  opts.algorithm = d.algorithm;
  switch (d.kind) {
    case Kind::Iallreduce: return runIallreduce(comm, d, opts);
    case Kind::Ibroadcast: return runIbroadcast(comm, d, opts);
    case Kind::Allgatherv: return runAllgatherv(comm, d, rng, opts);
    case Kind::Split: return runSplit(comm, rng);
    case Kind::Barrier: comm.barrier(opts); return true;
    default: break;
  }
  comm::BenchmarkOptions options;
  options.collective = static_cast<comm::Collective>(static_cast<int>(d.kind));
  options.dtype = d.dtype;
  options.op = d.op;
  options.root = d.root;
  options.inPlace = d.inPlace;
  comm::detail::BenchmarkCase one(comm, options, d.bytes);
  one.fillForCheck();
  one.run(opts);
  return one.verify();
}

/// Per-rank results, reduced over the ranks at the end.
struct RankTotals {
  double wrong = 0;
  double slowestUs = 0;
  double slowestIndex = -1;
  double delays = 0;
  double delayedMs = 0;
};

int runRank(comm::Communicator& comm, const SoakOptions& o) {
  std::mt19937_64 shared(o.seed);
  std::mt19937_64 delays(o.seed * 1000003 + static_cast<uint64_t>(comm.rank()));
  std::vector<Draw> draws;
  draws.reserve(static_cast<size_t>(o.count));
  std::vector<double> times;
  times.reserve(static_cast<size_t>(o.count));
  RankTotals mine;
  const auto start = Clock::now();
  for (long k = 0; k < o.count; ++k) {
    const Draw d = drawCall(shared, o);
    draws.push_back(d);
    if (comm.rank() == o.delayRank && delays() % 10000 < static_cast<uint64_t>(o.delayPercent * 100)) {
      const int ms = static_cast<int>(delays() % static_cast<uint64_t>(o.delayMaxMs + 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      mine.delays += 1;
      mine.delayedMs += ms;
    }
    const auto t0 = Clock::now();
    bool ok = false;
    try {
      ok = runOne(comm, d, shared);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "soak: rank %d, call #%ld (%s): %s\n", comm.rank(), k, describe(d).c_str(), e.what());
      return 1;
    }
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    times.push_back(us);
    if (us > mine.slowestUs) {
      mine.slowestUs = us;
      mine.slowestIndex = static_cast<double>(k);
    }
    if (!ok) {
      if (mine.wrong < 10)
        std::fprintf(stderr, "soak: rank %d, call #%ld (%s): wrong result\n", comm.rank(), k, describe(d).c_str());
      mine.wrong += 1;
    }
    if (comm.rank() == 0 && o.count >= 10 && (k + 1) % (o.count / 10) == 0)
      std::fprintf(stderr, "soak: %ld of %ld calls, %.0f s\n", k + 1, o.count,
                   std::chrono::duration<double>(Clock::now() - start).count());
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // Every rank's totals to every rank: (wrong, slowest µs, its index, delays, delayed ms).
  const int n = comm.size();
  std::vector<double> all(static_cast<size_t>(n) * 5);
  double row[5] = {mine.wrong, mine.slowestUs, mine.slowestIndex, mine.delays, mine.delayedMs};
  comm.allgather(row, all.data(), 5, DType::F64);
  if (comm.rank() != 0) return mine.wrong > 0 ? 3 : 0;

  double wrong = 0, delayCount = 0, delayedMs = 0;
  int slowestRank = 0;
  for (int r = 0; r < n; ++r) {
    wrong += all[r * 5];
    if (all[r * 5 + 1] > all[slowestRank * 5 + 1]) slowestRank = r;
    delayCount += all[r * 5 + 3];
    delayedMs += all[r * 5 + 4];
  }
  std::vector<long> perKind(kKinds, 0);
  for (const Draw& d : draws) ++perKind[static_cast<int>(d.kind)];
  std::sort(times.begin(), times.end());
  const auto pick = [&](double q) { return times.empty() ? 0.0 : times[static_cast<size_t>(q * (times.size() - 1))]; };
  std::printf("soak: %d ranks on %d host(s), %ld calls, seed %llu, sizes 0..%zu B, %.1f s\n", n, o.hosts, o.count,
              static_cast<unsigned long long>(o.seed), o.maxBytes, seconds);
  if (o.delayRank >= 0)
    std::printf("soak: rank %d slept before %.0f calls (%.1f s in all, up to %d ms each)\n", o.delayRank, delayCount,
                delayedMs / 1000, o.delayMaxMs);
  std::printf("soak: calls by collective:");
  for (int c = 0; c < kKinds; ++c) std::printf(" %s %ld", kKindNames[c], perKind[c]);
  std::printf("\nsoak: rank 0 call time: median %.0f us, p99 %.0f us, max %.0f us\n", pick(0.5), pick(0.99),
              pick(1.0));
  const long slowest = static_cast<long>(all[slowestRank * 5 + 2]);
  if (slowest >= 0)
    std::printf("soak: slowest call: #%ld %s, %.1f ms on rank %d\n", slowest, describe(draws[slowest]).c_str(),
                all[slowestRank * 5 + 1] / 1000, slowestRank);
  std::printf("soak: errors: %.0f wrong results, 0 failed calls\n", wrong);
  std::fflush(stdout);
  return wrong > 0 ? 3 : 0;
}

SoakOptions parseArgs(int argc, char** argv) {
  SoakOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 >= argc) KOLO_THROW(InvalidArgument, "soak: ", arg, " needs a value");
    const char* value = argv[++i];
    if (arg == "--count") o.count = std::stol(value);
    else if (arg == "--ranks") o.ranks = std::stoi(value);
    else if (arg == "--seed") o.seed = std::stoull(value);
    else if (arg == "--max-bytes") o.maxBytes = std::stoull(value);
    else if (arg == "--hosts") o.hosts = std::stoi(value);
    else if (arg == "--delay-rank") o.delayRank = std::stoi(value);
    else if (arg == "--delay-percent") o.delayPercent = std::stod(value);
    else if (arg == "--delay-max-ms") o.delayMaxMs = std::stoi(value);
    else if (arg == "--timeout-s") o.timeoutSeconds = std::stoi(value);
    else KOLO_THROW(InvalidArgument, "soak: unknown option ", arg);
  }
  if (o.count < 0 || o.ranks < 1 || o.hosts < 1 || o.hosts > o.ranks || o.delayRank >= o.ranks ||
      o.delayMaxMs < 0 || o.timeoutSeconds < 1)
    KOLO_THROW(InvalidArgument, "soak: options out of range");
  return o;
}

/// Forks the ranks over a file store in a fresh directory; the first rank that fails stops
/// the others. Returns 0 (all right), 3 (a wrong result) or 1 (a rank failed).
int forkRanks(const SoakOptions& o) {
  std::string pattern = (std::filesystem::temp_directory_path() / "kolo-soak-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) KOLO_THROW(IoError, "soak: mkdtemp: ", std::strerror(errno));
  const std::string storeDir = pattern;
  std::fflush(stdout);
  std::vector<pid_t> children;
  const pid_t parent = getpid();
  for (int r = 0; r < o.ranks; ++r) {
    const pid_t pid = fork();
    if (pid < 0) KOLO_THROW(IoError, "soak: fork: ", std::strerror(errno));
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      int code = 1;
      try {
        comm::NativeOptions options;
        options.timeout = std::chrono::seconds(o.timeoutSeconds);
        options.storePrefix = "kolo-soak";
        // Hosts by rank blocks: shared memory inside a host, TCP between hosts.
        options.hostId = "soak-host-" + std::to_string(r * o.hosts / o.ranks);
        auto comm = comm::createNativeCommunicator(comm::makeFileStore(storeDir), r, o.ranks, options);
        code = runRank(*comm, o);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "soak: rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    children.push_back(pid);
  }
  int result = 0;
  for (size_t running = children.size(); running > 0;) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    auto it = std::find(children.begin(), children.end(), pid);
    if (it == children.end()) continue;
    *it = -1;
    --running;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (!WIFEXITED(status))
      std::fprintf(stderr, "soak: rank %ld died of signal %d\n", static_cast<long>(it - children.begin()),
                   WTERMSIG(status));
    if (code != 0 && result != 1) {
      result = code == 3 ? 3 : 1;
      if (result == 1)
        for (pid_t child : children)
          if (child > 0) kill(child, SIGTERM);
    }
  }
  std::filesystem::remove_all(storeDir);
  if (result == 1) std::printf("soak: a rank failed (see above)\n");
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return forkRanks(parseArgs(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
