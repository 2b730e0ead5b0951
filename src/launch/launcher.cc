// `kolo run`'s job control: hosting or joining the store, spawning the local ranks in
// their own process groups, one poll() loop over their output pipes and a signal pipe
// (SIGCHLD, SIGINT, SIGTERM), and stopping every rank (SIGTERM, then SIGKILL after the
// grace period) when one fails or the launcher is told to stop. Ranks die with the launcher
// (spawn.h), and each starts bound to its CPU (comm/affinity.h) unless binding is off. How the
// launchers of several nodes agree is nodes.cc's; what a failed rank means for the job
// (stop, or go on) is loss_policy.cc's; the stall watch and the dumps are job_debug.cc's.
#include "launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "comm/token.h"
#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "kolo/settings.h"
#include "launch/job.h"

extern char** environ;

namespace kolo::parallel {
namespace detail {
namespace {

using namespace std::chrono_literals;

constexpr int kReapIntervalMs = 250;
// How often the launcher looks for the ranks' flight recorders while it collects them.
constexpr int kDumpPollMs = 50;

/// The environment of one rank: the launcher's own, minus the variables it sets.
std::vector<std::string> rankEnvironment(
    const std::vector<std::pair<std::string, std::string>>& vars) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    bool overridden = false;
    for (const auto& [key, value] : vars) overridden = overridden || key == name;
    if (!overridden) env.push_back(std::move(entry));
  }
  for (const auto& [key, value] : vars) env.push_back(key + "=" + value);
  return env;
}

// GLIBC_TUNABLES for the ranks, so that glibc's malloc (2.35 and later; older ones ignore
// the name) puts its heap on transparent huge pages: a training step streams tens of MiB of
// activations through the caches, and with 4 KiB pages its products wait on page walks (the
// lm's step: 1.3 % faster). The environment's GLIBC_TUNABLES with glibc.malloc.hugetlb=1
// added; nullopt (leave it) where it names hugetlb already or KOLO_HUGE_PAGES is 0.
std::optional<std::string> hugePageTunables(const settings::Environment& env) {
  if (!env.flag("KOLO_HUGE_PAGES")) return std::nullopt;
  constexpr std::string_view kHugePages = "glibc.malloc.hugetlb=1";
  const std::string* tunables = env.find("GLIBC_TUNABLES");
  if (!tunables) return std::string(kHugePages);
  if (tunables->find("glibc.malloc.hugetlb") != std::string::npos) return std::nullopt;
  return *tunables + ":" + std::string(kHugePages);
}

}  // namespace

void say(const std::string& message) {
  std::string line = "kolo run: " + message + "\n";
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
}

std::string describeStatus(int status) {
  if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = ::sigabbrev_np(sig);
    return "was killed by signal " + std::to_string(sig) +
           (name ? std::string(" (SIG") + name + ")" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exitCodeFor(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status) ? WEXITSTATUS(status) : 1;
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

Job::~Job() {
  for (auto& r : ranks_) {
    if (r.outFd >= 0) ::close(r.outFd);
    if (r.errFd >= 0) ::close(r.errFd);
  }
}

int Job::run() {
  std::string token = options_.token;
  if (token.empty()) {
    if (nodes() > 1)
      KOLO_THROW(
          InvalidArgument, "kolo run: a job of ", nodes(),
          " nodes needs a token shared by every node: set KOLO_TOKEN to the same value on each");
    token = comm::detail::randomToken(16);  // 128 bits as 32 hex digits
  }
  auto rendezvous = options_.timeoutSeconds > 0 ? std::chrono::milliseconds(static_cast<int64_t>(
                                                      std::ceil(options_.timeoutSeconds * 1000)))
                                                : std::chrono::milliseconds(5min);
  // Forked first, while the launcher holds few descriptors and no rank exists yet.
  // Elastic jobs may start up to maxRanks() replacements besides.
  guard_ = std::make_unique<JobGuard>(options_.procsPerNode + (options_.elastic ? maxRanks() : 0));
  std::string storeAddress = options_.storeAddress;
  psServers_ = options_.psServers;
  psWorkers_ = options_.psWorkers;
  int firstRank = options_.nodeRank * options_.procsPerNode;
  worldSize_ = options_.nnodes * options_.procsPerNode;
  if (psServers_ > 0 && !options_.psJoin) {
    const int ranks = psServers_ + 1 + psWorkers_;
    firstRank = psNodeRanks(ranks, options_.nnodes, options_.nodeRank).first;
    worldSize_ = ranks;
  }
  if (options_.psJoin) firstRank = joinParameterServerJob(storeAddress, token, rendezvous);
  if (options_.nodeRank == 0 && !options_.psJoin) {
    comm::TcpStoreServerOptions serverOptions;
    serverOptions.token = token;
    if (storeAddress.empty()) {
      serverOptions.host = "127.0.0.1";
    } else {
      serverOptions.port = comm::parseHostPort(storeAddress).port;
    }
    server_ = std::make_unique<comm::TcpStoreServer>(serverOptions);
    if (storeAddress.empty()) storeAddress = "127.0.0.1:" + std::to_string(server_->port());
  }
  if (nodes() > 1) {
    store_ = comm::connectTcpStore(storeAddress, token, rendezvous);
    registerNode(rendezvous);
  }
  // Node 0's ranks use the root; every other host's ranks their host store.
  const std::string rankStore =
      nodes() > 1 && !server_ ? startHostStore(storeAddress, token, rendezvous) : storeAddress;
  // Elastic jobs: the launcher marks lost ranks in the store for the survivors.
  if (options_.elastic && !store_) store_ = comm::connectTcpStore(storeAddress, token, rendezvous);

  vars_ = {
      {"KOLO_WORLD_SIZE", std::to_string(worldSize_)},
      {"KOLO_LOCAL_SIZE", std::to_string(options_.procsPerNode)},
      {"KOLO_NODE_RANK", std::to_string(options_.nodeRank)},
      {"KOLO_NNODES", std::to_string(options_.nnodes)},
      {"KOLO_STORE", rankStore},
      {"KOLO_TOKEN", token},
  };
  if (auto tunables = hugePageTunables(settings::Environment::process()))
    vars_.emplace_back("GLIBC_TUNABLES", *tunables);
  setUpDebugDirectory(firstRank);
  events_ = std::make_unique<JobEvents>(options_.eventsFile);
  events_->started(worldSize_, options_.procsPerNode, firstRank);
  if (debug_) vars_.emplace_back("KOLO_DEBUG_DIR", debug_->dir());
  if (options_.elastic) {
    vars_.emplace_back("KOLO_ELASTIC_MIN_RANKS", std::to_string(options_.minRanks));
    vars_.emplace_back("KOLO_ELASTIC_MAX_RANKS", std::to_string(maxRanks()));
  }
  if (options_.timeoutSeconds > 0) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", options_.timeoutSeconds);
    vars_.emplace_back("KOLO_TIMEOUT", text);
  }
  ranks_.resize(static_cast<size_t>(options_.procsPerNode));
  // --elastic --nnodes MIN:MAX: a node beyond MIN starts its ranks as joiners of the
  // running job.
  const bool lateNode = options_.nodeRank >= options_.nnodes;
  if (lateNode)
    say("node " + std::to_string(options_.nodeRank) + " joins the running elastic job with " +
        std::to_string(options_.procsPerNode) + " rank(s)");
  // A lone rank has no local peer to keep apart from: it keeps the whole mask (its
  // threads may use every CPU).
  bind_ = options_.procsPerNode > 1 ? options_.bind : comm::CpuBinding::None;
  if (bind_ != comm::CpuBinding::None) cpus_ = comm::allowedCpus();
  for (int local = 0; local < options_.procsPerNode; ++local) {
    Rank& r = ranks_[static_cast<size_t>(local)];
    r.localRank = local;
    r.globalRank = firstRank + local;
    std::vector<std::pair<std::string, std::string>> roleVars;
    if (lateNode) {
      r.joiner = true;
      roleVars = {{"KOLO_ELASTIC_JOIN", "1"}};
    }
    if (psServers_ > 0) {
      assignRole(r);
      roleVars = {{"KOLO_ROLE", r.role},
                  {"KOLO_ROLE_INDEX", std::to_string(r.roleIndex)},
                  {"KOLO_PS_SERVERS", std::to_string(psServers_)},
                  {"KOLO_PS_WORKERS", std::to_string(psWorkers_)}};
    }
    if (!start(r, roleVars)) {
      exitCode_ = 127;
      beginStop(SIGTERM);
      break;
    }
  }
  if (exitCode_ == 0) sayPids();
  if (store_) watchRemoteFailure(storeAddress, token, rendezvous);
  loop();
  failureWatch_.reset();
  if (debug_ && debug_->collecting()) printDiagnosis();
  guard_->release();  // every rank is reaped: nothing is left for the guard to stop
  finishAcrossNodes(rendezvous);
  mergeTimeline();
  if (!failure_.empty()) say("job failed: " + failure_);
  events_->ended(exitCode_, failure_);
  return exitCode_;
}

void Job::assignRole(Rank& r) const {
  const int servers = psServers_;
  if (r.globalRank < servers) {
    r.role = "ps";
    r.roleIndex = r.globalRank;
  } else if (r.globalRank == servers) {
    r.role = "chief";
    r.roleIndex = 0;
  } else {
    r.role = "worker";
    r.roleIndex = r.globalRank - servers - 1;
  }
}

void Job::sayPids() const {
  // One line, so that a user attaching a debugger or `kill -STOP` to a rank need not wait for
  // it to die to learn its pid.
  std::string line = "started " + std::to_string(ranks_.size()) + " rank(s): ";
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const Rank& r = ranks_[i];
    std::string role;
    if (!r.role.empty())
      role = r.role == "chief" ? " (chief)"
                               : " (" + std::string(r.role == "ps" ? "parameter server " : "worker ") +
                                     std::to_string(r.roleIndex) + ")";
    line += (i == 0 ? "" : ", ") + ("rank " + std::to_string(r.globalRank)) + role + " pid " +
            std::to_string(r.pid);
  }
  say(line);
}

std::string Job::describeRank(const Rank& r) {
  if (r.role.empty()) return "rank " + std::to_string(r.globalRank);
  const std::string name = r.role == "ps" ? "parameter server" : r.role;
  return name + (r.role == "chief" ? "" : " " + std::to_string(r.roleIndex)) + " (rank " +
         std::to_string(r.globalRank) + ")";
}

bool Job::start(Rank& r, std::vector<std::pair<std::string, std::string>> vars) {
  vars.insert(vars.begin(), vars_.begin(), vars_.end());
  vars.emplace_back("KOLO_RANK", std::to_string(r.globalRank));
  vars.emplace_back("KOLO_LOCAL_RANK", std::to_string(r.localRank));
  // The rank inherits the spawning thread's mask: bind this thread while it spawns.
  comm::ScopedThreadBinding bound(comm::cpuForLocalRank(bind_, r.localRank, cpus_));
  return spawn(r, rankEnvironment(vars));
}

int Job::maxRanks() const {
  return options_.maxRanks > 0 ? options_.maxRanks : nodes() * options_.procsPerNode;
}

int Job::nodes() const { return std::max(options_.nnodes, options_.maxNodes); }

bool Job::spawn(Rank& r, const std::vector<std::string>& env) {
  SpawnedRank started = spawnRank(options_.command, env);
  if (started.pid < 0) {
    say("cannot start rank " + std::to_string(r.globalRank) + ": '" + options_.command[0] +
        "': " + std::strerror(started.error));
    return false;
  }
  r.pid = started.pid;
  guard_->watch(r.pid);
  r.running = true;
  r.outFd = started.outFd;
  r.errFd = started.errFd;
  std::string prefix = "[rank " + std::to_string(r.globalRank) + "] ";
  if (r.role == "ps") prefix = "[ps " + std::to_string(r.roleIndex) + "] ";
  if (r.role == "chief") prefix = "[chief] ";
  if (r.role == "worker") prefix = "[worker " + std::to_string(r.roleIndex) + "] ";
  r.out = std::make_unique<LinePrefixer>(STDOUT_FILENO, prefix);
  r.err = std::make_unique<LinePrefixer>(STDERR_FILENO, prefix);
  return true;
}

bool Job::anyRunning() const {
  for (const auto& r : ranks_)
    if (r.running) return true;
  return false;
}

void Job::signalAll(int sig) {
  for (const auto& r : ranks_)
    if (r.pid > 0) ::kill(-r.pid, sig);
}

void Job::beginStop(int sig) {
  if (stopping_) return;
  stopping_ = true;
  killDeadline_ = Clock::now() + options_.gracePeriod;
  signalAll(sig);
}

void Job::loop() {
  for (;;) {
    // Output pipes stay open while anyone holds their write end; once every rank is
    // reaped, what is already in them is drained and the job is over.
    if (!anyRunning()) {
      // Children the ranks left behind in their groups may have ignored the signal
      // (a shell's background jobs ignore SIGINT): when stopping, the job ends with them.
      if (stopping_) signalAll(SIGKILL);
      drainAll();
      return;
    }
    std::vector<pollfd> fds;
    fds.push_back({signals_.fd(), POLLIN, 0});
    const bool watching = failureWatch_ && !stopping_;
    if (watching) fds.push_back({failureWatch_->fd(), POLLIN, 0});
    const size_t firstPipe = fds.size();
    std::vector<std::pair<Rank*, bool>> owners;  // (rank, is stderr) for each pipe
    for (auto& r : ranks_) {
      if (r.outFd >= 0) {
        fds.push_back({r.outFd, POLLIN, 0});
        owners.emplace_back(&r, false);
      }
      if (r.errFd >= 0) {
        fds.push_back({r.errFd, POLLIN, 0});
        owners.emplace_back(&r, true);
      }
    }
    int timeoutMs = -1;
    if (stopping_) timeoutMs = remainingMs(killDeadline_);
    if (survivorsDeadline_ && !stopping_)
      timeoutMs = timeoutMs < 0 ? remainingMs(*survivorsDeadline_)
                                : std::min(timeoutMs, remainingMs(*survivorsDeadline_));
    // Ranks are also reaped on a timer, in case a SIGCHLD was merged or lost.
    timeoutMs = timeoutMs < 0 ? kReapIntervalMs : std::min(timeoutMs, kReapIntervalMs);
    if (debug_ && debug_->collecting()) timeoutMs = std::min(timeoutMs, kDumpPollMs);
    ::poll(fds.data(), fds.size(), timeoutMs);
    for (size_t i = firstPipe; i < fds.size(); ++i)
      if (fds[i].revents) readPipe(*owners[i - firstPipe].first, owners[i - firstPipe].second);
    if (fds[0].revents & POLLIN) handleSignals();
    reap();
    stopLateSurvivors();
    endLostWorkers();
    watchDebug();
    if (stopping_ && !killed_ && Clock::now() >= killDeadline_) {
      say("ranks still running after the grace period; sending SIGKILL");
      signalAll(SIGKILL);
      killed_ = true;
    }
    if (watching && (fds[1].revents & POLLIN) && !stopping_) checkRemoteFailure();
  }
}

int Job::remainingMs(Clock::time_point when) {
  auto now = Clock::now();
  if (when <= now) return 0;
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(when - now).count());
}

void Job::readPipe(Rank& r, bool isErr) {
  int& fd = isErr ? r.errFd : r.outFd;
  LinePrefixer& sink = isErr ? *r.err : *r.out;
  char buf[65536];
  ssize_t n = ::read(fd, buf, sizeof buf);
  if (n > 0) {
    sink.feed(buf, static_cast<size_t>(n));
    return;
  }
  if (n < 0 && errno == EINTR) return;
  sink.finish();
  ::close(fd);
  fd = -1;
}

void Job::drainAll() {
  for (auto& r : ranks_) {
    for (bool isErr : {false, true}) {
      int& fd = isErr ? r.errFd : r.outFd;
      if (fd < 0) continue;
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      LinePrefixer& sink = isErr ? *r.err : *r.out;
      char buf[65536];
      ssize_t n;
      while ((n = ::read(fd, buf, sizeof buf)) > 0) sink.feed(buf, static_cast<size_t>(n));
      sink.finish();
      ::close(fd);
      fd = -1;
    }
  }
}

void Job::handleSignals() {
  unsigned char byte = 0;
  while (::read(signals_.fd(), &byte, 1) == 1) {
    int sig = byte;
    if (sig == SIGCHLD) continue;  // reaped below
    if (stopping_) {
      // A second request while stopping: do not wait for the grace period.
      say(std::string("received SIG") + ::sigabbrev_np(sig) + " again; sending SIGKILL");
      signalAll(SIGKILL);
      killed_ = true;
      continue;
    }
    say(std::string("received SIG") + ::sigabbrev_np(sig) + "; forwarding it to every rank");
    exitCode_ = 128 + sig;
    failure_ = std::string("stopped by SIG") + ::sigabbrev_np(sig);
    publishFailure(std::string("node ") + std::to_string(options_.nodeRank) +
                   "'s launcher received SIG" + ::sigabbrev_np(sig));
    beginStop(sig);
  }
  reap();
}


}  // namespace detail

NodeRanks psNodeRanks(int ranks, int nnodes, int nodeRank) {
  const int each = ranks / nnodes, extra = ranks % nnodes;
  return {nodeRank * each + std::min(nodeRank, extra), each + (nodeRank < extra ? 1 : 0)};
}

void parseNodeRange(const std::string& text, LauncherOptions& options) {
  const size_t colon = text.find(':');
  auto number = [&text](const std::string& part) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || value < 1)
      KOLO_THROW(InvalidArgument, "kolo run: --nnodes ", text, " is not M or MIN:MAX (whole numbers, at least 1)");
    return value;
  };
  options.nnodes = number(text.substr(0, colon));
  if (colon == std::string::npos) return;
  options.maxNodes = number(text.substr(colon + 1));
  if (!options.elastic || options.maxNodes < options.nnodes)
    KOLO_THROW(InvalidArgument, "kolo run: --nnodes ", text, ": MIN:MAX needs --elastic and MAX at least MIN");
}

int runLauncher(const LauncherOptions& given) {
  LauncherOptions options = given;
  if (options.token.empty()) options.token = settings::token();
  if (options.procsPerNode < 1)
    KOLO_THROW(InvalidArgument, "kolo run: -n must be at least 1, got ", options.procsPerNode);
  if (options.nnodes < 1)
    KOLO_THROW(InvalidArgument, "kolo run: --nnodes must be at least 1, got ", options.nnodes);
  if (options.maxNodes != 0 && (!options.elastic || options.maxNodes < options.nnodes))
    KOLO_THROW(InvalidArgument, "kolo run: --nnodes ", options.nnodes, ":", options.maxNodes,
               " needs --elastic and MAX at least MIN");
  const int nodes = std::max(options.nnodes, options.maxNodes);
  if (options.nodeRank < 0 || options.nodeRank >= nodes)
    KOLO_THROW(InvalidArgument, "kolo run: --node-rank ", options.nodeRank, " is outside 0..",
               nodes - 1);
  if (nodes > 1 && options.storeAddress.empty())
    KOLO_THROW(InvalidArgument, "kolo run: a job of ", nodes,
               " nodes needs --store HOST:PORT (node 0's address)");
  if (options.stallSeconds < 0)
    KOLO_THROW(InvalidArgument, "kolo run: --stall-seconds must be at least 0, got ",
               options.stallSeconds);
  if (options.command.empty())
    KOLO_THROW(InvalidArgument, "kolo run: no program given (kolo run -n N -- PROGRAM ARGS...)");
  if (!options.storeAddress.empty()) comm::parseHostPort(options.storeAddress);
  if (options.elastic && (options.psServers > 0 || options.psJoin))
    KOLO_THROW(InvalidArgument, "kolo run --elastic trains data parallel (no --ps or --join)");
  // The job starts with -n ranks on each of the first nnodes nodes.
  const int starting = options.procsPerNode * options.nnodes;
  const std::string startingText =
      "-n " + std::to_string(options.procsPerNode) +
      (options.nnodes > 1 ? " x " + std::to_string(options.nnodes) + " nodes" : "");
  if (options.elastic && (options.minRanks < 1 || options.minRanks > starting))
    KOLO_THROW(InvalidArgument, "kolo run: --min-ranks ", options.minRanks, " must be within 1..",
               starting, " (", startingText, ")");
  if (options.elastic && options.maxRanks != 0 && options.maxRanks < starting)
    KOLO_THROW(InvalidArgument, "kolo run: --max-ranks ", options.maxRanks, " is below ", startingText,
               ": the job starts with those ranks and replaces lost ones up to --max-ranks");
  if (options.psJoin) {
    if (options.storeAddress.empty() || options.token.empty() || options.procsPerNode != 1)
      KOLO_THROW(InvalidArgument,
                 "kolo run --join needs --store HOST:PORT and KOLO_TOKEN of the "
                 "running job (started with the same), and starts one worker");
  } else if (options.psServers > 0) {
    if (options.psWorkers < 1)
      KOLO_THROW(InvalidArgument, "kolo run: --ps needs --workers W (at least 1)");
    const int ranks = options.psServers + 1 + options.psWorkers;
    if (ranks < options.nnodes)
      KOLO_THROW(InvalidArgument, "kolo run: --ps ", options.psServers, " --workers ",
                 options.psWorkers, " starts ", ranks, " processes, fewer than --nnodes ",
                 options.nnodes);
    options.procsPerNode = psNodeRanks(ranks, options.nnodes, options.nodeRank).count;
  }
  detail::SignalScope signals;
  detail::Job job(options, signals);
  return job.run();
}

bool nodesFromSlurm(parallel::LauncherOptions& options) {
  const comm::LaunchInfo step = comm::detectLaunch();
  if (step.launcher != "slurm" || step.size == 1) return false;
  KOLO_REQUIRE(step.localSize == 1,
               "kolo run under srun starts one launcher per node, but this "
               "step runs ",
               step.localSize,
               " tasks on this node: use srun --ntasks-per-node=1 "
               "kolo run -n G ... (or --nnodes, --node-rank and --store by hand)");
  KOLO_REQUIRE(!step.storeAddress.empty(),
               "kolo run under srun: the step names no first node "
               "(SLURM_STEP_NODELIST) or job id: give --nnodes, --node-rank and --store");
  options.nnodes = step.size;
  options.nodeRank = step.rank;
  options.storeAddress = step.storeAddress;
  options.token = step.token;
  if (options.token.empty()) {
    const settings::Environment env = settings::Environment::process();
    const std::string* job = env.find("SLURM_JOB_ID");
    const std::string* stepId = env.find("SLURM_STEP_ID");
    options.token = "slurm-" + (job ? *job : "") + "." + (stepId ? *stepId : "");
  }
  return true;
}

}  // namespace kolo::parallel
