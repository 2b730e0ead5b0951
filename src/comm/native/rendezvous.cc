// createNativeCommunicator: rendezvous through the store (the host table and this host's
// ranks' records, not every rank's), shared-memory segment per host, token-checked TCP
// connections between hosts opened when first needed (connector.h), and the
// cross-memory-attach probe.
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "comm/native/cma_allreduce.h"
#include "comm/native/control_plane.h"
#include "comm/native/native_communicator.h"
#include "comm/native/rank_record.h"
#include "comm/observers.h"
#include "comm/shm_file.h"
#include "comm/socket.h"
#include "comm/token.h"
#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/settings.h"

namespace kolo::comm {

namespace {

using native::Clock;
using native::RankRecord;

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

/// Listening socket for peers on the given address (every interface when empty, dual-stack
/// where possible) and a free port; fills port.
int openListener(const std::string& address, int& port) {
  detail::ListenOptions listen;
  listen.firstOnly = true;
  std::string error;
  const std::vector<int> fds = detail::listenTcp(address, 0, listen, &error);
  if (fds.empty()) KOLO_THROW(IoError, "cannot listen for peers on '", address, "': ", error);
  port = detail::boundPort(fds.front());
  return fds.front();
}

/// Addresses peers may reach us at: the explicit one, else the store connection's
/// local address, then every interface (loopback last).
std::vector<std::string> publishedAddresses(const std::string& listenAddress, Store* store) {
  if (!listenAddress.empty()) return {listenAddress};
  std::vector<std::string> out;
  if (auto* tcp = dynamic_cast<TcpStoreClient*>(store)) {
    try {
      out.push_back(tcp->localAddress());
    } catch (const Error&) {
    }
  }
  std::vector<std::string> loopback;
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr) continue;
      const int fam = i->ifa_addr->sa_family;
      if (fam != AF_INET && fam != AF_INET6) continue;
      if (fam == AF_INET6 && IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr))
        continue;
      const std::string a = detail::addressText(i->ifa_addr);
      if (a.empty()) continue;
      if (a == "127.0.0.1" || a == "::1") {
        loopback.push_back(a);
      } else {
        out.push_back(a);
      }
    }
    freeifaddrs(ifs);
  }
  // A record holds a bounded number of addresses: drop the last interfaces, not loopback.
  const size_t room = native::kMaxRecordAddresses - loopback.size();
  if (out.size() > room) out.resize(room);
  for (auto& a : loopback) out.push_back(a);
  if (out.empty()) out.push_back("127.0.0.1");
  return out;
}

size_t ringBytesFor(int localCount, size_t requested) {
  size_t bytes = requested;
  if (bytes == 0) bytes = localCount <= 4 ? (size_t{1} << 20) : localCount <= 16 ? (size_t{1} << 19) : (size_t{1} << 18);
  size_t p = 4096;
  while (p < bytes) p <<= 1;
  return p;
}

/// Rings one rank writes under the built-in algorithms: ring neighbours, tree parent and
/// children, halving-doubling partners (log2 n) and the root of reduce-to-one. Rings for
/// other pairs (user send/recv, all-to-all) are created as they are first used.
size_t expectedRingsPerRank(int localCount) {
  size_t log2 = 0;
  while ((size_t{1} << log2) < static_cast<size_t>(localCount)) ++log2;
  return std::min(static_cast<size_t>(localCount - 1), 4 + log2);
}

/// Refuses a host whose shared memory cannot hold the control block and the expected rings.
void checkSharedMemoryFits(int localCount, size_t ringBytes, const std::string& hostId) {
  const size_t needed = native::HostSegment::controlBytes(localCount) +
                        static_cast<size_t>(localCount) * expectedRingsPerRank(localCount) * ringBytes;
  std::string where;
  const size_t available = detail::shmBytesAvailable(&where);
  if (needed > available)
    KOLO_THROW(IoError, localCount, " local ranks need ", needed >> 20, " MiB of shared memory (", ringBytes >> 10,
               " KiB rings), but ", where, " on host ", hostId, " has ", available >> 20, " MiB available");
}

}  // namespace

std::shared_ptr<Communicator> createNativeCommunicator(std::shared_ptr<Store> store, int rank, int size,
                                                       const NativeOptions& options) {
  if (!store) KOLO_THROW(InvalidArgument, "createNativeCommunicator: no store");
  if (size < 1 || rank < 0 || rank >= size)
    KOLO_THROW(InvalidArgument, "createNativeCommunicator: rank ", rank, " outside a world of ", size);
  if (options.timeout.count() <= 0) KOLO_THROW(InvalidArgument, "createNativeCommunicator: timeout must be positive");
  const auto timeout = options.timeout;
  const std::string prefix = options.storePrefix + "/native/";

  auto job = std::make_shared<native::JobState>();
  job->engine = std::make_shared<native::Engine>(rank, size);
  job->cmaThresholdBytes = options.crossMemoryAttachMinBytes;
  job->envAlgorithm = options.algorithm;
  if (job->envAlgorithm == Algorithm::Auto) job->envAlgorithm = parseAlgorithm(settings::algo());


  // Publish who and where we are. The probe word lets peers test cross-memory attach.
  int port = 0;
  const int listener = openListener(options.listenAddress, port);
  struct ListenerGuard {
    int fd;
    ~ListenerGuard() {
      if (fd >= 0) close(fd);
    }
  } guard{listener};
  auto probe = std::make_shared<uint64_t>(0);
  detail::randomBytes(probe.get(), sizeof(uint64_t));
  RankRecord me;
  me.hostId = options.hostId.empty() ? detail::machineHostId() : options.hostId;
  me.pid = static_cast<int>(getpid());
  me.port = port;
  me.addresses = publishedAddresses(options.listenAddress, store.get());
  me.probeAddress = reinterpret_cast<uint64_t>(probe.get());
  me.probeValue = *probe;
  me.cpus = allowedCpus();
  // The job token (drawn by rank 0, presented on every TCP connection), every rank's host,
  // this host's ranks' records and those of the peers the built-in algorithms pair this rank
  // with. Where other peers listen is read when a connection to one is first needed.
  const native::RendezvousView view =
      native::joinRendezvous(*store, prefix, rank, size, me, options.sharedMemory, timeout);
  const std::vector<int>& local = view.localRanks;
  const std::vector<RankRecord>& localInfos = view.localRecords;
  const std::vector<uint32_t> hostOf = view.hosts.expand();
  job->hostOf.assign(hostOf.begin(), hostOf.end());
  job->pids.assign(static_cast<size_t>(size), 0);
  for (size_t i = 0; i < local.size(); ++i) job->pids[static_cast<size_t>(local[i])] = localInfos[i].pid;
  const int myHost = job->hostOf[rank];
  const int localCount = static_cast<int>(local.size());
  int myLocal = 0;
  for (int i = 0; i < localCount; ++i)
    if (local[i] == rank) myLocal = i;
  const bool useShm = options.sharedMemory && localCount > 1;
  {
    // Oversubscribed when the host's ranks outnumber the CPUs they may use together (each
    // may be bound to one CPU of its own, as `kolo run` and mpirun bind them).
    std::vector<bool> seen;
    int cores = 0;
    for (const RankRecord& info : localInfos) {
      for (int c : info.cpus) {
        if (static_cast<size_t>(c) >= seen.size()) seen.resize(static_cast<size_t>(c) + 1, false);
        if (!seen[static_cast<size_t>(c)]) ++cores;
        seen[static_cast<size_t>(c)] = true;
      }
    }
    job->oversubscribed = localCount > std::max(cores, 1);
    job->engine->setSpinTime(job->oversubscribed ? std::chrono::microseconds(5) : std::chrono::microseconds(250));
  }

  // Shared memory: the host's lowest rank creates the control block as an unnamed file and
  // publishes "<pid> <fd>"; the others open it through /proc and say so, then the creator
  // closes its descriptor. No name exists at any moment, so a SIGKILL anywhere leaves
  // nothing behind. A host whose memory cannot hold the job is refused here, on every
  // local rank, before anything is reserved.
  if (useShm) {
    const std::string recordKey = prefix + "shm/" + std::to_string(local[0]);
    const size_t ringBytes = ringBytesFor(localCount, options.ringBytes);
    if (myLocal == 0) {
      try {
        checkSharedMemoryFits(localCount, ringBytes, me.hostId);
        job->segment = native::HostSegment::create("kolo-" + detail::hexText(view.token, 4), localCount, ringBytes);
      } catch (const Error& e) {
        native::HostSegmentRecord failed;
        failed.error = e.what();
        if (failed.error.empty()) failed.error = "unknown error";
        store->setString(recordKey, native::encodeHostSegmentRecord(failed));
        throw;
      }
      store->setString(recordKey, native::encodeHostSegmentRecord({me.pid, job->segment->fd(), ""}));
    } else {
      const native::HostSegmentRecord record =
          native::decodeHostSegmentRecord(store->getString(recordKey, timeout), rank);
      if (!record.error.empty())
        KOLO_THROW(IoError, "rendezvous on rank ", rank, ": no shared memory on this host (", record.error, ")");
      try {
        job->segment = native::HostSegment::open(record.pid, record.fd);
      } catch (const IoError& e) {
        // The block is reached through its creator's /proc entry, which goes with it.
        if (!native::processAlive(record.pid))
          KOLO_THROW(PeerError, "rendezvous on rank ", rank, ": rank ", local[0], " (pid ", record.pid, ") on host ",
                     me.hostId, " exited before its shared memory was opened: ", e.what());
        throw;
      }
      if (job->segment->localCount() != localCount)
        KOLO_THROW(FormatError, "rendezvous on rank ", rank, ": the host segment is for ",
                   job->segment->localCount(), " ranks, this host has ", localCount);
    }
    job->segment->doorbell(myLocal).pid.store(me.pid);
    store->setString(prefix + "shm-mapped/" + std::to_string(rank), "1");
    if (myLocal == 0) {
      std::vector<std::string> mapped;
      for (int r : local) mapped.push_back(prefix + "shm-mapped/" + std::to_string(r));
      store->wait(mapped, timeout);
      job->segment->closeFd();
    }
    job->engine->setDoorbell(&job->segment->doorbell(myLocal));
    for (int i = 0; i < localCount; ++i) {
      if (i == myLocal) continue;
      job->engine->setChannel(local[i], std::make_unique<native::ShmChannel>(job->segment, myLocal, i,
                                                                             localInfos[i].pid, timeout));
    }
  }

  // TCP to the peers on other hosts (and, without shared memory, on this one): opened when
  // an operation first needs one. Shared-memory peers keep the channels made above: a
  // ShmChannel costs nothing until its first message, which makes its ring.
  native::ConnectorOptions connector;
  connector.rank = rank;
  connector.size = size;
  std::memcpy(connector.token, view.token, sizeof connector.token);
  connector.overTcp.resize(static_cast<size_t>(size));
  for (int peer = 0; peer < size; ++peer)
    connector.overTcp[static_cast<size_t>(peer)] = peer != rank && !(useShm && job->hostOf[peer] == myHost);
  for (size_t i = 0; i < view.likelyRanks.size(); ++i)
    connector.known.emplace(view.likelyRanks[i], view.likelyRecords[i]);
  connector.lookup = [store, prefix, timeout](const std::vector<int>& peers) {
    return native::fetchRankRecords(*store, prefix, peers, timeout);
  };
  connector.connectTimeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(3));
  if (std::find(connector.overTcp.begin(), connector.overTcp.end(), true) != connector.overTcp.end()) {
    connector.listener = listener;
    guard.fd = -1;  // the connector owns it now
    job->engine->setConnector(std::make_unique<native::Connector>(std::move(connector)));
  }

  // Cross-memory attach: usable only if every rank can read every local peer.
  bool cmaOk = options.crossMemoryAttach;
  if (cmaOk && useShm) {
    for (size_t i = 0; i < local.size(); ++i) {
      if (local[i] == rank) continue;
      const RankRecord& info = localInfos[i];
      uint64_t value = 0;
      if (!native::readPeerMemory(info.pid, &value, reinterpret_cast<const void*>(info.probeAddress),
                                  sizeof(value)) ||
          value != info.probeValue) {
        cmaOk = false;
      }
    }
  }
  const bool allCma = native::agreeAll(*store, prefix, "cma", size, cmaOk, timeout);
  job->cmaUsable = allCma && options.sharedMemory;
  // Peers read our probe word until they have published their verdict: keep it alive.
  job->probe = probe;

  std::vector<int> members(static_cast<size_t>(size));
  std::vector<bool> sameHost(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) {
    members[r] = r;
    sameHost[r] = job->hostOf[r] == myHost;
  }
  auto links = std::make_unique<native::GroupLinks>(job->engine, std::move(members), rank, 1u, std::move(sameHost));
  auto communicator = std::make_shared<native::NativeCommunicator>(job, std::move(links), timeout);
  detail::joinObservers(*store, prefix, rank, size, timeout);
  return communicator;
}

}  // namespace kolo::comm
