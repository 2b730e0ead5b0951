// detectLaunch and initFromEnvironment: where this process stands in a job, read from the
// variables of `kolo run`, torchrun, Open MPI or Slurm (in that order of precedence), and
// the communicator built from it. The environment is read once per call, through the
// settings registry (kolo/settings.h) for the KOLO_* variables.
#include "kolo/comm/init.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cmath>
#include <thread>

#include "kolo/comm/mpi.h"
#include "kolo/comm/native.h"
#include "kolo/comm/slurm.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/settings.h"

namespace kolo::comm {
namespace {

using Env = std::map<std::string, std::string>;

const std::string* find(const Env& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parseInt(const std::string& name, const std::string& text) {
  int value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size())
    KOLO_THROW(InvalidArgument, "environment variable ", name, "='", text, "' is not an integer");
  return value;
}

int intVar(const Env& env, const std::string& name, int fallback) {
  const std::string* text = find(env, name);
  return text ? parseInt(name, *text) : fallback;
}

/// "HOST:PORT" with brackets around an IPv6 literal.
std::string joinHostPort(const std::string& host, const std::string& port) {
  return (host.find(':') != std::string::npos && host.front() != '[' ? "[" + host + "]" : host) +
         ":" + port;
}

/// Slurm's tasks-per-node lists look like "2(x3),1": expands it and picks entry `node`.
int slurmTasksOnNode(const std::string& text, int node) {
  int index = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(',', pos);
    std::string item = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int repeat = 1;
    size_t paren = item.find("(x");
    if (paren != std::string::npos) {
      repeat = parseInt("SLURM_TASKS_PER_NODE", item.substr(paren + 2, item.size() - paren - 3));
      item = item.substr(0, paren);
    }
    int count = parseInt("SLURM_TASKS_PER_NODE", item);
    if (node < index + repeat) return count;
    index += repeat;
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  KOLO_THROW(InvalidArgument, "SLURM_TASKS_PER_NODE='", text, "' has no entry for node ", node);
}

void checkPlace(const LaunchInfo& info, const std::string& source) {
  if (info.size < 1 || info.rank < 0 || info.rank >= info.size)
    KOLO_THROW(InvalidArgument, source, " variables give rank ", info.rank, " of world size ",
               info.size);
  if (info.localSize < 1 || info.localRank < 0 || info.localRank >= info.localSize)
    KOLO_THROW(InvalidArgument, source, " variables give local rank ", info.localRank,
               " of local size ", info.localSize);
}

/// The first of `names` that is set, with its value (nullptr when none is).
std::pair<std::string, const std::string*> firstOf(const Env& env,
                                                   std::initializer_list<const char*> names) {
  for (const char* name : names)
    if (const std::string* value = find(env, name)) return {name, value};
  return {"", nullptr};
}

/// The store of a Slurm job step, as PyTorch's usual Slurm recipe finds it: MASTER_ADDR, else
/// the step's first host (rank 0 runs there); KOLO_STORE_PORT, else MASTER_PORT, else a port
/// derived from the job and step ids. "" when neither a host nor a job id is known.
std::string slurmStoreAddress(const Env& env, const settings::Environment& known) {
  std::string host;
  if (const std::string* addr = find(env, "MASTER_ADDR")) {
    host = *addr;
  } else if (const auto [name, list] =
                 firstOf(env, {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
             list) {
    host = expandSlurmHostList(name, *list).front();
  }
  if (host.empty()) return "";
  int port = 0;
  if (const std::optional<int64_t> given = settings::storePort(known)) {
    if (*given < 1 || *given > 65535)
      KOLO_THROW(InvalidArgument, "KOLO_STORE_PORT='", *given, "' is not a port (1..65535)");
    port = static_cast<int>(*given);
  } else if (const std::string* masterPort = find(env, "MASTER_PORT")) {
    port = parseInt("MASTER_PORT", *masterPort);
  } else {
    const auto [jobName, job] = firstOf(env, {"SLURM_JOB_ID", "SLURM_JOBID"});
    if (!job) return "";
    const auto [stepName, step] = firstOf(env, {"SLURM_STEP_ID", "SLURM_STEPID"});
    port = slurmStorePort(parseInt(jobName, *job), step ? parseInt(stepName, *step) : 0);
  }
  return joinHostPort(host, std::to_string(port));
}

/// A KOLO_* integer that must fit an int (ranks and sizes).
int rankNumber(std::optional<int64_t> value, const char* name, int fallback) {
  if (!value) return fallback;
  if (*value < INT_MIN || *value > INT_MAX)
    KOLO_THROW(InvalidArgument, name, "='", *value, "' is out of range");
  return static_cast<int>(*value);
}

/// Keeps the store server (hosted by rank 0 under torchrun-style variables) alive exactly
/// as long as the communicator that uses it; members are destroyed bottom-up.
struct HostedCommunicator {
  std::unique_ptr<TcpStoreServer> server;
  std::shared_ptr<Communicator> communicator;
};

}  // namespace

LaunchInfo detectLaunch(const std::map<std::string, std::string>& env) {
  LaunchInfo info;
  const settings::Environment known(env);
  const std::string token = settings::token(known);
  const std::optional<int64_t> rankVar = settings::rank(known), sizeVar = settings::worldSize(known);
  if (rankVar && sizeVar) {
    info.launcher = "kolo";
    info.rank = rankNumber(rankVar, "KOLO_RANK", 0);
    info.size = rankNumber(sizeVar, "KOLO_WORLD_SIZE", 1);
    info.localRank = rankNumber(settings::localRank(known), "KOLO_LOCAL_RANK", info.rank);
    info.localSize = rankNumber(settings::localSize(known), "KOLO_LOCAL_SIZE", info.size);
    info.storeAddress = settings::store(known);
    info.token = token;
    checkPlace(info, "KOLO_RANK, KOLO_WORLD_SIZE, KOLO_LOCAL_RANK and KOLO_LOCAL_SIZE");
    return info;
  }
  if (find(env, "RANK") && find(env, "WORLD_SIZE")) {
    info.launcher = "torchrun";
    info.rank = intVar(env, "RANK", 0);
    info.size = intVar(env, "WORLD_SIZE", 1);
    info.localRank = intVar(env, "LOCAL_RANK", info.rank);
    info.localSize = intVar(env, "LOCAL_WORLD_SIZE", info.size);
    const std::string* addr = find(env, "MASTER_ADDR");
    const std::string* port = find(env, "MASTER_PORT");
    if (addr && port) {
      // torchrun's own agent already serves its (c10d) store on MASTER_PORT; ours then
      // takes the next port. Without the agent (plain env:// variables), MASTER_PORT.
      const std::string* agentStore = find(env, "TORCHELASTIC_USE_AGENT_STORE");
      int storePort =
          parseInt("MASTER_PORT", *port) + (agentStore && *agentStore == "True" ? 1 : 0);
      info.storeAddress = joinHostPort(*addr, std::to_string(storePort));
    }
    info.token = token;
    checkPlace(info, "torchrun (RANK/WORLD_SIZE)");
    return info;
  }
  if (find(env, "OMPI_COMM_WORLD_RANK") && find(env, "OMPI_COMM_WORLD_SIZE")) {
    info.launcher = "mpi";
    info.rank = intVar(env, "OMPI_COMM_WORLD_RANK", 0);
    info.size = intVar(env, "OMPI_COMM_WORLD_SIZE", 1);
    info.localRank = intVar(env, "OMPI_COMM_WORLD_LOCAL_RANK", info.rank);
    info.localSize = intVar(env, "OMPI_COMM_WORLD_LOCAL_SIZE", info.size);
    checkPlace(info, "Open MPI (OMPI_COMM_WORLD_*)");
    return info;
  }
  // An sbatch script's own shell has SLURM_PROCID=0 and the job's SLURM_NTASKS but is no
  // step (no SLURM_STEP_ID): a program it runs without srun is one process.
  const bool slurmBatchShell =
      find(env, "SLURM_JOB_ID") && !find(env, "SLURM_STEP_ID") && !find(env, "SLURM_STEPID");
  if (find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS") && !slurmBatchShell) {
    info.launcher = "slurm";
    info.rank = intVar(env, "SLURM_PROCID", 0);
    info.size = intVar(env, "SLURM_NTASKS", 1);
    info.localRank = intVar(env, "SLURM_LOCALID", 0);
    const std::string* perNode = find(env, "SLURM_STEP_TASKS_PER_NODE");
    if (!perNode) perNode = find(env, "SLURM_TASKS_PER_NODE");
    info.localSize =
        perNode ? slurmTasksOnNode(*perNode, intVar(env, "SLURM_NODEID", 0)) : info.size;
    info.storeAddress = slurmStoreAddress(env, known);
    info.token = token;
    checkPlace(info, "Slurm (SLURM_*)");
    return info;
  }
  return info;
}

LaunchInfo detectLaunch() { return detectLaunch(settings::Environment::process().variables()); }

bool hasSpareCore(int threadsPerRank) {
  const int localRanks = std::max(1, detectLaunch().localSize);
  return std::max(1u, std::thread::hardware_concurrency()) >
         static_cast<unsigned>(localRanks * std::max(1, threadsPerRank));
}

std::shared_ptr<Communicator> initFromEnvironment(const InitOptions& options) {
  const settings::Environment known = settings::Environment::process();
  LaunchInfo info = detectLaunch(known.variables());

  std::string backend = options.backend;
  if (known.source("KOLO_BACKEND") == settings::Source::Environment)
    backend = settings::backend(known);
  if (backend != "auto" && backend != "native" && backend != "mpi")
    KOLO_THROW(InvalidArgument, "InitOptions::backend '", backend,
               "' is not accepted: use auto, native or mpi");
  auto timeout = options.timeout;
  if (const std::optional<double> seconds = settings::timeout(known))
    timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(*seconds * 1000)));

  // Under srun, MPI starts only from the PMI server of an `srun --mpi=pmix|pmi2` step, and
  // Debian's Open MPI not even then: MPI_Init would abort the whole step with Open MPI's own
  // text. So `auto` is native there, and an explicit `mpi` without a PMI server is refused.
  const bool useMpi = backend == "mpi" || (backend == "auto" && info.launcher == "mpi" &&
                                           mpiAvailable());
  if (useMpi && info.launcher == "slurm" && !find(known.variables(), "PMIX_RANK") &&
      !find(known.variables(), "PMI_RANK") && !find(known.variables(), "PMI_FD"))
    KOLO_THROW(InvalidArgument, "rank ", info.rank, " of ", info.size,
               ": the MPI backend cannot start under this srun (the step has no PMI server: "
               "PMIX_RANK and PMI_RANK are unset; srun --mpi=pmix provides one where Slurm and MPI "
               "were built with it); unset KOLO_BACKEND (auto is native under srun) or set "
               "KOLO_BACKEND=native, or start the ranks with mpirun inside the allocation");
  if (useMpi) {
    auto communicator = createMpiCommunicator();
    communicator->setTimeout(timeout);
    if (info.launcher != "single" && info.launcher != "kolo" &&
        (communicator->size() != info.size || communicator->rank() != info.rank))
      KOLO_THROW(Mismatch, "MPI says rank ", communicator->rank(), " of ", communicator->size(),
                 " but the ", info.launcher, " variables say rank ", info.rank, " of ", info.size,
                 " (was the program started without MPI support? try KOLO_BACKEND=native)");
    return communicator;
  }

  NativeOptions nativeOptions;
  nativeOptions.timeout = timeout;
  if (info.storeAddress.empty()) {
    if (info.size != 1)
      KOLO_THROW(InvalidArgument, "rank ", info.rank, " of ", info.size, " (from ", info.launcher,
                 " variables) has no store address: set MASTER_ADDR and MASTER_PORT (under srun: "
                 "SLURM_STEP_NODELIST and SLURM_JOB_ID name it), start the job with kolo's launcher "
                 "(KOLO_STORE), or use the MPI backend");
    return createNativeCommunicator(makeMemoryStore(), 0, 1, nativeOptions);
  }

  auto holder = std::make_shared<HostedCommunicator>();
  if (info.launcher != "kolo" && info.rank == 0) {
    // torchrun's or Slurm's variables: rank 0 hosts the store that every rank (itself
    // included) connects to, on every interface so other hosts reach it.
    TcpStoreServerOptions serverOptions;
    serverOptions.port = parseHostPort(info.storeAddress).port;
    serverOptions.token = info.token;
    holder->server = std::make_unique<TcpStoreServer>(serverOptions);
  }
  auto store = connectTcpStore(info.storeAddress, info.token, timeout);
  holder->communicator = createNativeCommunicator(store, info.rank, info.size, nativeOptions);
  return std::shared_ptr<Communicator>(holder, holder->communicator.get());
}

}  // namespace kolo::comm
