// benchmarkRendezvous (rendezvous_benchmark.h). The parent hosts the TCP store server and
// forks the processes whose threads are the ranks, each process holding whole simulated
// hosts and running their host stores; every rank connects its own client and
// runs the rendezvous functions createNativeCommunicator runs, a counter barrier, a step's
// store operations and, with a drop, the elastic membership agreement and the next
// generation's rendezvous. Each process marks its lost ranks as `kolo run --elastic`'s agent
// does. Times are CLOCK_MONOTONIC, common to the processes; each phase ends when its last
// rank is through.
#include "launch/rendezvous_benchmark.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "comm/native/control_plane.h"
#include "comm/observers.h"
#include "comm/token.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "parallel/elastic/membership.h"
#include "parallel/elastic/store_keys.h"

namespace kolo::launch {
namespace {

constexpr int kDefaultRanksPerProcess = 4096;
constexpr int kDefaultRanksPerHost = 8;
/// Stack of a simulated rank: its deepest path is a store request and a record decode.
constexpr size_t kRankStackBytes = size_t{256} << 10;
/// Descriptors the store process and each rank process need besides the ranks'.
constexpr uint64_t kSpareFiles = 64;
const std::string kPrefix = "kolo-bench-rendezvous";
/// Niceness of the rank processes (the store's stays as it was).
constexpr int kRankNice = 10;

enum Phase { kStart, kRendezvous, kBarrier, kStep, kRegroup, kPhases };

struct RankTimes {
  int64_t at[kPhases] = {};  // CLOCK_MONOTONIC ns; 0 = not reached
  int64_t neighboursChecked = 0;  // neighbours' records found to be theirs, both generations
};

int64_t nowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

/// What every rank process knows before it starts.
struct Plan {
  int ranks = 0;
  int hosts = 0;
  uint16_t port = 0;
  std::string token;
  bool hostStores = false;
  bool fullAddressBook = false;
  std::chrono::milliseconds timeout{0};
  std::vector<char> lost;  // by rank
  int lostCount = 0;
  std::vector<int> members;  // 0..ranks-1, shared by every rank's membership proposal
};

int hostOf(const Plan& plan, int rank) {
  return static_cast<int>(int64_t{rank} * plan.hosts / plan.ranks);
}

/// What a rank of simulated host `host` publishes: one address, one CPU, as under `kolo run`.
comm::native::RankRecord simulatedRecord(int rank, int host) {
  comm::native::RankRecord record;
  record.hostId = "simulated-host-" + std::to_string(host);
  record.pid = static_cast<int>(getpid());
  record.port = 1024 + rank % 60000;
  record.addresses = {"127.0.0.1"};
  record.probeAddress = 0x7f0000000000u + static_cast<uint64_t>(rank) * 64;
  record.probeValue = static_cast<uint64_t>(rank) * 2654435761u;
  record.cpus = {rank % kDefaultRanksPerHost};
  return record;
}

/// createNativeCommunicator's store operations for `rank` of `size` under `prefix`: the
/// same joinRendezvous (token, host table, the records of this host's ranks and of the
/// peers the built-in algorithms pair it with), the cross-memory-attach agreement and the
/// clock exchange (with `fullAddressBook`, every record too). `hostOfRank` gives the
/// simulated host of a rank of this generation.
/// Every record read must be the one its rank published and the host table must agree with
/// the simulated hosts (else Mismatch naming the rank). Returns how many ring neighbours'
/// records were checked (2: a ring neighbour is on this host or among the likely peers).
int rendezvous(comm::Store& store, const std::string& prefix, int rank, int size,
               const std::function<int(int)>& hostOfRank, bool fullAddressBook, std::chrono::milliseconds timeout) {
  const comm::native::RendezvousView view = comm::native::joinRendezvous(
      store, prefix, rank, size, simulatedRecord(rank, hostOfRank(rank)), /*sharedMemory=*/true, timeout);
  if (fullAddressBook) {
    std::vector<int> everyRank(static_cast<size_t>(size));
    std::iota(everyRank.begin(), everyRank.end(), 0);
    comm::native::fetchRankRecords(store, prefix, everyRank, timeout);
  }
  const auto check = [&](int peer, const comm::native::RankRecord& record) {
    comm::native::RankRecord expected = simulatedRecord(peer, hostOfRank(peer));
    expected.pid = record.pid;  // the process that runs it
    if (record != expected)
      KOLO_THROW(Mismatch, "rank ", rank, " read a record under rank ", peer, "'s key (", prefix,
                 ") that is not the one rank ", peer, " published");
    const bool sameHost = hostOfRank(peer) == hostOfRank(rank);
    if ((view.hosts.hostOf(peer) == view.hosts.hostOf(rank)) != sameHost)
      KOLO_THROW(Mismatch, "rank ", rank, "'s host table puts rank ", peer, " on ", sameHost ? "another host" : "its host");
  };
  for (size_t i = 0; i < view.localRanks.size(); ++i) check(view.localRanks[i], view.localRecords[i]);
  for (size_t i = 0; i < view.likelyRanks.size(); ++i) check(view.likelyRanks[i], view.likelyRecords[i]);
  int neighboursChecked = 0;
  for (int neighbour : {(rank + size - 1) % size, (rank + 1) % size}) {
    const auto among = [neighbour](const std::vector<int>& ranks) {
      return std::find(ranks.begin(), ranks.end(), neighbour) != ranks.end();
    };
    if (among(view.localRanks) || among(view.likelyRanks)) ++neighboursChecked;
  }
  comm::native::agreeAll(store, prefix, "cma", size, true, timeout);
  comm::detail::alignClocks(store, prefix, rank, size, false, timeout);
  return neighboursChecked;
}

/// One simulated rank, start to end, with its store at `storePort` (the root or its host's
/// store); failures land in `error`.
void runRank(const Plan& plan, int rank, uint16_t storePort, RankTimes& times, std::string& error) {
  try {
    times.at[kStart] = nowNs();
    comm::TcpStoreClientOptions client;
    client.host = "127.0.0.1";
    client.port = storePort;
    client.token = plan.token;
    client.connectTimeout = plan.timeout;
    client.requestTimeout = plan.timeout;
    auto store = std::make_unique<comm::TcpStoreClient>(client);
    // Generation 0's communicator prefix, as ElasticContext::connect names it.
    times.neighboursChecked += rendezvous(
        *store, kPrefix + "/g0/comm/native/", rank, plan.ranks, [&](int r) { return hostOf(plan, r); },
        plan.fullAddressBook, plan.timeout);
    times.at[kRendezvous] = nowNs();
    comm::native::storeBarrier(*store, kPrefix + "/barrier/g0", plan.ranks, plan.timeout);
    times.at[kBarrier] = nowNs();
    store->add(kPrefix + "/steps", 1);
    store->check({kPrefix + "/stop"});
    times.at[kStep] = nowNs();
    if (plan.lostCount == 0 || plan.lost[static_cast<size_t>(rank)]) return;  // a lost rank's connection closes
    // A survivor learns of the loss when the launchers have marked every lost rank (a real
    // one from its failed collective, at about that time).
    store->wait({kPrefix + "/marked"}, plan.timeout);
    parallel::detail::MembershipProposal proposal;
    proposal.prefix = kPrefix;
    proposal.id = rank;
    proposal.generation = 0;
    proposal.members = plan.members;
    proposal.completedStep = 1;
    proposal.minRanks = 1;
    proposal.maxRanks = plan.ranks;
    proposal.timeout = plan.timeout;
    const parallel::detail::MembershipAgreement agreed =
        parallel::detail::agreeMembership(*store, proposal, "ranks dropped by the benchmark");
    const std::vector<int>& members = agreed.change.members;
    const int newRank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    const int newSize = static_cast<int>(members.size());
    times.neighboursChecked += rendezvous(
        *store, kPrefix + "/g1/comm/native/", newRank, newSize,
        [&](int r) { return hostOf(plan, members[static_cast<size_t>(r)]); }, plan.fullAddressBook, plan.timeout);
    comm::native::storeBarrier(*store, kPrefix + "/barrier/g1", newSize, plan.timeout);
    times.at[kRegroup] = nowNs();
  } catch (const std::exception& e) {
    error = "rank " + std::to_string(rank) + ": " + e.what();
  }
}

/// Reads or writes exactly n bytes of a pipe; false when it closed early.
bool readAll(int fd, void* data, size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool writeAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

/// A process's ranks [first, last): threads with small stacks, held at a gate until the
/// parent says go, so that thread creation is not timed. Reports through `out`: the times,
/// the moment its lost ranks were marked, the first error. Runs in the forked child.
int runProcess(const Plan& forked, int first, int last, int goFd, int out) {
  // The root store's port comes first through the gate: the parent forks before it starts the
  // store's thread, so that no thread of the parent holds a lock (an allocator's under ASan)
  // that this copy of the process would inherit held.
  Plan plan = forked;
  if (!readAll(goFd, &plan.port, sizeof plan.port)) return 1;
  // In a job the store has a core of its own while each rank waits on its own host; here
  // thousands of simulated ranks share the store's cores, so they yield to it.
  if (::setpriority(PRIO_PROCESS, 0, kRankNice) != 0)
    std::fprintf(stderr, "kolo bench rendezvous: cannot lower the ranks' priority: %s\n", std::strerror(errno));
  const int count = last - first;
  // The host stores of this process's hosts, up before any rank connects, as `kolo run`
  // starts a host's store before its ranks.
  std::vector<std::unique_ptr<comm::TcpStoreServer>> hostStores;
  std::vector<uint16_t> storePort(static_cast<size_t>(count), plan.port);
  if (plan.hostStores) {
    try {
      for (int r = first; r < last; ++r) {
        if (r > first && hostOf(plan, r) == hostOf(plan, r - 1)) {
          storePort[static_cast<size_t>(r - first)] = storePort[static_cast<size_t>(r - first - 1)];
          continue;
        }
        comm::TcpStoreServerOptions options;
        options.host = "127.0.0.1";
        options.token = plan.token;
        options.upstream = "127.0.0.1:" + std::to_string(plan.port);
        options.upstreamTimeout = plan.timeout;
        hostStores.push_back(std::make_unique<comm::TcpStoreServer>(options));
        storePort[static_cast<size_t>(r - first)] = hostStores.back()->port();
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kolo bench rendezvous: cannot start a host store: %s\n", e.what());
      return 1;
    }
  }
  std::vector<RankTimes> times(static_cast<size_t>(count));
  std::vector<std::string> errors(static_cast<size_t>(count));
  std::vector<int64_t> failedAt(static_cast<size_t>(count), 0);
  std::mutex mutex;
  std::condition_variable changed;
  bool go = false;
  int lostDone = 0;
  struct Job {
    std::function<void()> body;
  };
  std::vector<std::unique_ptr<Job>> jobs;
  std::vector<pthread_t> threads;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kRankStackBytes);
  for (int r = first; r < last; ++r) {
    auto job = std::make_unique<Job>();
    job->body = [&, r] {
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return go; });
      }
      runRank(plan, r, storePort[static_cast<size_t>(r - first)],
              times[static_cast<size_t>(r - first)], errors[static_cast<size_t>(r - first)]);
      failedAt[static_cast<size_t>(r - first)] = nowNs();
      if (plan.lostCount > 0 && plan.lost[static_cast<size_t>(r)]) {
        std::lock_guard lock(mutex);
        ++lostDone;
        changed.notify_all();
      }
    };
    pthread_t thread;
    const int rc = pthread_create(
        &thread, &attr, [](void* arg) -> void* {
          static_cast<Job*>(arg)->body();
          return nullptr;
        },
        job.get());
    if (rc != 0) {
      std::fprintf(stderr, "kolo bench rendezvous: cannot start the thread of rank %d: %s\n", r, std::strerror(rc));
      return 1;
    }
    threads.push_back(thread);
    jobs.push_back(std::move(job));
  }
  pthread_attr_destroy(&attr);
  char byte = 1;
  if (!writeAll(out, &byte, 1) || !readAll(goFd, &byte, 1)) return 1;
  {
    std::lock_guard lock(mutex);
    go = true;
  }
  changed.notify_all();

  // This process is the launcher of its ranks: once its lost ranks are gone it marks them
  // lost, and the launcher that completes the count opens the survivors' regroup.
  int64_t markedAt = 0;
  std::string markError;
  int myLost = 0;
  for (int r = first; r < last; ++r) myLost += plan.lostCount > 0 && plan.lost[static_cast<size_t>(r)];
  if (myLost > 0) {
    {
      std::unique_lock lock(mutex);
      changed.wait(lock, [&] { return lostDone == myLost; });
    }
    try {
      comm::TcpStoreClientOptions client;
      client.host = "127.0.0.1";
      client.port = plan.port;
      client.token = plan.token;
      client.connectTimeout = plan.timeout;
      client.requestTimeout = plan.timeout;
      comm::TcpStoreClient store(client);
      for (int r = first; r < last; ++r)
        if (plan.lost[static_cast<size_t>(r)]) store.setString(parallel::elasticLostKey(r, kPrefix), "1");
      if (store.add(kPrefix + "/marked-count", myLost) == plan.lostCount) store.setString(kPrefix + "/marked", "1");
      markedAt = nowNs();
    } catch (const std::exception& e) {
      markError = std::string("marking lost ranks: ") + e.what();
    }
  }
  for (pthread_t thread : threads) pthread_join(thread, nullptr);
  for (auto& store : hostStores) store->stop();

  // The first failure is the one to report: the ranks that waited for it time out later.
  std::string error = markError;
  int64_t firstFailure = markError.empty() ? INT64_MAX : 0;
  for (int i = 0; i < count && error.empty(); ++i)
    if (!errors[static_cast<size_t>(i)].empty() && failedAt[static_cast<size_t>(i)] < firstFailure) {
      firstFailure = failedAt[static_cast<size_t>(i)];
    }
  for (int i = 0; i < count && error.empty(); ++i)
    if (!errors[static_cast<size_t>(i)].empty() && failedAt[static_cast<size_t>(i)] == firstFailure)
      error = errors[static_cast<size_t>(i)];
  const uint64_t errorBytes = error.size();
  const bool sent = writeAll(out, times.data(), times.size() * sizeof(RankTimes)) &&
                    writeAll(out, &markedAt, sizeof markedAt) && writeAll(out, &firstFailure, sizeof firstFailure) &&
                    writeAll(out, &errorBytes, sizeof errorBytes) &&
                    writeAll(out, error.data(), error.size());
  return sent ? 0 : 1;
}

uint64_t statusField(const char* name) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const size_t length = std::strlen(name);
  while (std::getline(status, line))
    if (line.compare(0, length, name) == 0) return std::strtoull(line.c_str() + length, nullptr, 10) * 1024;
  return 0;
}

uint64_t raiseFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return 0;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  return limit.rlim_cur;
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

}  // namespace

RendezvousBenchmarkResult benchmarkRendezvous(const RendezvousBenchmarkOptions& options) {
  KOLO_REQUIRE(options.ranks >= 2, "rendezvous benchmark: ranks must be at least 2, got ", options.ranks);
  KOLO_REQUIRE(options.hosts >= 0 && options.hosts <= options.ranks, "rendezvous benchmark: hosts must be within 0..",
               options.ranks, ", got ", options.hosts);
  KOLO_REQUIRE(options.dropPercent >= 0 && options.dropPercent <= 50,
               "rendezvous benchmark: the percent of ranks dropped must be within 0..50, got ", options.dropPercent);
  KOLO_REQUIRE(options.ranksPerProcess >= 0, "rendezvous benchmark: ranks per process must not be negative, got ",
               options.ranksPerProcess);
  KOLO_REQUIRE(options.timeout.count() > 0, "rendezvous benchmark: the timeout must be positive");
  RendezvousBenchmarkResult result;
  result.ranks = options.ranks;
  result.fileLimit = raiseFileLimit();
  const int perProcess =
      options.ranksPerProcess > 0 ? options.ranksPerProcess : kDefaultRanksPerProcess;
  Plan plan;
  plan.ranks = options.ranks;
  plan.hosts = options.hosts > 0 ? options.hosts : std::max(1, options.ranks / kDefaultRanksPerHost);
  plan.timeout = options.timeout;
  plan.hostStores = options.hostStores;
  plan.fullAddressBook = options.fullAddressBook;
  plan.lost.assign(static_cast<size_t>(options.ranks), 0);
  plan.lostCount = static_cast<int>(options.ranks * options.dropPercent / 100.0);
  // Spread the lost ranks over the job (every k-th rank), as failures of single ranks are.
  for (int i = 0; i < plan.lostCount; ++i)
    plan.lost[static_cast<size_t>(int64_t{i} * options.ranks / plan.lostCount)] = 1;
  plan.members.resize(static_cast<size_t>(options.ranks));
  std::iota(plan.members.begin(), plan.members.end(), 0);
  uint8_t tokenBytes[16];
  comm::detail::randomBytes(tokenBytes, sizeof tokenBytes);
  plan.token = comm::detail::hexText(tokenBytes, sizeof tokenBytes);
  result.hosts = plan.hosts;
  result.lost = plan.lostCount;
  // Without host stores the root holds a descriptor per rank; with them a rank process holds
  // two per rank it runs (the rank's end and its host store's), and whole hosts.
  const uint64_t largestHost = (static_cast<uint64_t>(options.ranks) + plan.hosts - 1) / plan.hosts;
  const uint64_t needed =
      (options.hostStores ? 2 * std::max<uint64_t>(std::min(options.ranks, perProcess), largestHost)
                          : static_cast<uint64_t>(options.ranks)) +
      kSpareFiles;
  if (needed > result.fileLimit)
    KOLO_THROW(InvalidArgument, "rendezvous benchmark: ", options.ranks, " ranks on ", plan.hosts,
               " hosts need ", needed,
               " open files in one process, but this process may open at most ", result.fileLimit,
               " (the hard limit of RLIMIT_NOFILE)");

  struct Child {
    pid_t pid = -1;
    int go = -1;   // parent writes
    int out = -1;  // parent reads
    int first = 0, last = 0;
  };
  std::vector<Child> children;
  std::string failure;
  for (int first = 0; first < options.ranks;) {
    Child child;
    child.first = first;
    child.last = std::min(options.ranks, first + perProcess);
    if (options.hostStores) {
      // Whole hosts: up to the end of the host of the last rank that fits, or of the first
      // rank's host when that host alone is larger.
      int last = child.last;
      while (last < options.ranks && hostOf(plan, last) == hostOf(plan, last - 1)) ++last;
      if (last - first > perProcess && hostOf(plan, child.last - 1) != hostOf(plan, first)) {
        last = child.last;
        while (hostOf(plan, last - 1) == hostOf(plan, last)) --last;
      }
      child.last = last;
    }
    first = child.last;
    int goPipe[2], outPipe[2];
    if (::pipe2(goPipe, O_CLOEXEC) != 0 || ::pipe2(outPipe, O_CLOEXEC) != 0)
      KOLO_THROW(IoError, "rendezvous benchmark: cannot create a pipe: ", std::strerror(errno));
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) KOLO_THROW(IoError, "rendezvous benchmark: cannot fork: ", std::strerror(errno));
    if (pid == 0) {
      ::close(goPipe[1]);
      ::close(outPipe[0]);
      _exit(runProcess(plan, child.first, child.last, goPipe[0], outPipe[1]));
    }
    ::close(goPipe[0]);
    ::close(outPipe[1]);
    child.pid = pid;
    child.go = goPipe[1];
    child.out = outPipe[0];
    children.push_back(child);
  }
  result.processes = static_cast<int>(children.size());
  // The root store, started once every process is forked; its port opens their gates.
  const uint64_t residentBefore = statusField("VmRSS:");
  comm::TcpStoreServerOptions serverOptions;
  serverOptions.host = "127.0.0.1";
  serverOptions.token = plan.token;
  std::unique_ptr<comm::TcpStoreServer> started;
  try {
    started = std::make_unique<comm::TcpStoreServer>(serverOptions);
  } catch (...) {
    for (Child& child : children) {  // each gate closed: the process ends without starting
      ::close(child.go);
      ::close(child.out);
      ::waitpid(child.pid, nullptr, 0);
    }
    throw;
  }
  comm::TcpStoreServer& server = *started;
  plan.port = server.port();
  for (Child& child : children) writeAll(child.go, &plan.port, sizeof plan.port);
  // Every process has its threads waiting: start them together.
  for (Child& child : children) {
    char byte = 0;
    if (!readAll(child.out, &byte, 1) && failure.empty())
      failure = "a rank process ended before its ranks were ready";
  }
  for (Child& child : children) {
    char byte = 1;
    writeAll(child.go, &byte, 1);
  }
  std::vector<RankTimes> times(static_cast<size_t>(options.ranks));
  int64_t markedAt = 0, failedFirst = failure.empty() ? INT64_MAX : INT64_MIN;
  for (Child& child : children) {
    int64_t childMarked = 0, childFailed = 0;
    uint64_t errorBytes = 0;
    const bool ok = readAll(child.out, times.data() + child.first, sizeof(RankTimes) * (child.last - child.first)) &&
                    readAll(child.out, &childMarked, sizeof childMarked) &&
                    readAll(child.out, &childFailed, sizeof childFailed) &&
                    readAll(child.out, &errorBytes, sizeof errorBytes) && errorBytes <= (1u << 20);
    std::string error(ok ? errorBytes : 0, '\0');
    if (ok && errorBytes > 0) readAll(child.out, error.data(), error.size());
    if (!ok && failedFirst != INT64_MIN) {
      failure = "the process of ranks " + std::to_string(child.first) + ".." + std::to_string(child.last - 1) +
                " ended without its results";
      failedFirst = INT64_MIN;
    }
    // The earliest failure of any process: the others' ranks time out waiting for it.
    if (!error.empty() && childFailed < failedFirst) {
      failure = error;
      failedFirst = childFailed;
    }
    markedAt = std::max(markedAt, childMarked);
    ::close(child.out);
    ::close(child.go);
    int status = 0;
    while (::waitpid(child.pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  const comm::TcpStoreServerStats stats = server.stats();
  server.stop();
  if (!failure.empty()) KOLO_THROW(Error, "rendezvous benchmark: ", failure);

  auto latest = [&](Phase phase, bool survivorsOnly) {
    int64_t last = 0;
    for (int r = 0; r < options.ranks; ++r)
      if (!survivorsOnly || !plan.lost[static_cast<size_t>(r)]) last = std::max(last, times[r].at[phase]);
    return last;
  };
  int64_t firstStart = INT64_MAX;
  for (const RankTimes& t : times) firstStart = std::min(firstStart, t.at[kStart]);
  result.rendezvousSeconds = seconds(latest(kRendezvous, false) - firstStart);
  result.barrierSeconds = seconds(latest(kBarrier, false) - latest(kRendezvous, false));
  result.stepSeconds = seconds(latest(kStep, false) - latest(kBarrier, false));
  if (plan.lostCount > 0) result.regroupSeconds = seconds(latest(kRegroup, true) - markedAt);
  const uint64_t peak = statusField("VmHWM:");
  result.storePeakBytes = peak > residentBefore ? peak - residentBefore : 0;
  for (const RankTimes& t : times) result.neighboursChecked += t.neighboursChecked;
  result.storeRequests = stats.requests;
  result.storeConnections = stats.connections;
  result.hostStores = options.hostStores ? plan.hosts : 0;
  result.storeBytesReceived = stats.bytesReceived;
  result.storeBytesSent = stats.bytesSent;
  return result;
}

std::string rendezvousBenchmarkTable(const RendezvousBenchmarkResult& r) {
  char text[1024];
  std::snprintf(text, sizeof text,
                "ranks %d on %d simulated hosts (%s; %d processes; open-file limit %llu)\n"
                "  rendezvous   %9.3f s\n"
                "  barrier      %9.3f s\n"
                "  step ops     %9.3f s\n"
                "%s"
                "  root store   %9.1f MiB peak   %llu connections   requests %llu   received %.1f "
                "MiB   sent %.1f "
                "MiB\n",
                r.ranks, r.hosts, r.hostStores > 0 ? "a host store each" : "every rank at the root",
                r.processes, static_cast<unsigned long long>(r.fileLimit), r.rendezvousSeconds,
                r.barrierSeconds, r.stepSeconds,
                r.lost > 0 ? ("  regroup      " + std::to_string(r.regroupSeconds).substr(0, 9) +
                              " s after losing " + std::to_string(r.lost) + " ranks\n")
                                 .c_str()
                           : "",
                static_cast<double>(r.storePeakBytes) / (1 << 20),
                static_cast<unsigned long long>(r.storeConnections),
                static_cast<unsigned long long>(r.storeRequests),
                static_cast<double>(r.storeBytesReceived) / (1 << 20),
                static_cast<double>(r.storeBytesSent) / (1 << 20));
  return text;
}

std::string rendezvousBenchmarkJson(const RendezvousBenchmarkResult& r) {
  nlohmann::ordered_json line;
  line["ranks"] = r.ranks;
  line["hosts"] = r.hosts;
  line["host_stores"] = r.hostStores;
  line["processes"] = r.processes;
  line["lost"] = r.lost;
  line["rendezvous_s"] = r.rendezvousSeconds;
  line["barrier_s"] = r.barrierSeconds;
  line["step_s"] = r.stepSeconds;
  if (r.lost > 0) line["regroup_s"] = r.regroupSeconds;
  line["neighbours_checked"] = r.neighboursChecked;
  line["store_peak_bytes"] = r.storePeakBytes;
  line["store_requests"] = r.storeRequests;
  line["store_connections"] = r.storeConnections;
  line["store_bytes_received"] = r.storeBytesReceived;
  line["store_bytes_sent"] = r.storeBytesSent;
  line["file_limit"] = r.fileLimit;
  return line.dump();
}

}  // namespace kolo::launch
