// The launchers of a job across nodes agree through the store: each registers its shape of
// the job (and a node that joins a running elastic job checks its own against node 0's), a
// failure is published under "kolo-run/failed" for the others to stop their ranks, and
// node 0, which hosts the store, keeps it up until every node that registered has finished;
// every other node's ranks reach that root store through a host store run by their launcher.
#include <memory>
#include <sstream>
#include <thread>

#include "parallel/ps/store_keys.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "launch/job.h"

namespace kolo::parallel::detail {
namespace {

using namespace std::chrono_literals;

constexpr char kFailedKey[] = "kolo-run/failed";
constexpr char kFinishedKey[] = "kolo-run/finished";
constexpr char kNodesKey[] = "kolo-run/nodes";  // how many nodes registered

}  // namespace

std::string Job::startHostStore(const std::string& rootAddress, const std::string& token,
                                std::chrono::milliseconds timeout) {
  // The host store listens where this host reaches the root from: the ranks' own store
  // connections then leave from that address, which they publish for their peers.
  auto* root = dynamic_cast<comm::TcpStoreClient*>(store_.get());
  const std::string here = root != nullptr ? root->localAddress() : "";
  if (here.empty()) return rootAddress;
  comm::TcpStoreServerOptions options;
  options.host = here;
  options.token = token;
  options.upstream = rootAddress;
  options.upstreamTimeout = timeout;
  hostStore_ = std::make_unique<comm::TcpStoreServer>(options);
  return comm::HostPort{here, hostStore_->port()}.toString();
}

void Job::registerNode(std::chrono::milliseconds timeout) {
  const std::string shape = psServers_ > 0 ? "--ps " + std::to_string(psServers_) + " --workers " +
                                                 std::to_string(psWorkers_)
                                           : "-n " + std::to_string(options_.procsPerNode);
  store_->setString("kolo-run/nproc/" + std::to_string(options_.nodeRank), shape);
  store_->add(kNodesKey, 1);
  // A node that joins a running elastic job (--nnodes MIN:MAX) checks its shape against
  // node 0's; the others wait for each other.
  if (options_.nodeRank >= options_.nnodes) {
    const std::string first = store_->getString("kolo-run/nproc/0", timeout);
    if (first != shape)
      KOLO_THROW(InvalidArgument, "kolo run: node 0 runs ", first, " but node ", options_.nodeRank,
                 " runs ", shape, "; every node must use the same");
    return;
  }
  std::vector<std::string> keys;
  for (int node = 0; node < options_.nnodes; ++node)
    keys.push_back("kolo-run/nproc/" + std::to_string(node));
  store_->wait(keys, timeout);
  for (int node = 0; node < options_.nnodes; ++node) {
    const std::string other = store_->getString(keys[static_cast<size_t>(node)], timeout);
    if (other != shape)
      KOLO_THROW(InvalidArgument, "kolo run: node ", node, " runs ", other, " but node ",
                 options_.nodeRank, " runs ", shape, "; every node must use the same");
  }
}

int Job::joinParameterServerJob(const std::string& storeAddress, const std::string& token,
                                std::chrono::milliseconds timeout) {
  std::shared_ptr<comm::Store> store = comm::connectTcpStore(storeAddress, token, timeout);
  const std::string shape = store->getString(parallel::ps::shapeKey(), timeout);
  // Read from the store, which any process of the job may write: bounded before the sums
  // below, and refused whole when it is anything but two numbers.
  constexpr int kMostProcesses = 1 << 20;
  std::istringstream in(shape);
  char rest = 0;
  if (!(in >> psServers_ >> psWorkers_) || (in >> rest) || psServers_ < 1 || psWorkers_ < 1 ||
      psServers_ > kMostProcesses || psWorkers_ > kMostProcesses)
    KOLO_THROW(FormatError, "kolo run --join: the job at ", storeAddress, " published the shape '",
               shape, "', not 'P W' (1 to ", kMostProcesses, " each)");
  const int64_t joined = store->add(parallel::ps::joinCounterKey(), 1);
  if (joined < 1 || joined > kMostProcesses)
    KOLO_THROW(FormatError, "kolo run --join: the job at ", storeAddress, " counts ", joined,
               " joined workers");
  say("joining the parameter-server job at " + storeAddress + " as worker " +
      std::to_string(psWorkers_ + joined - 1));
  return psServers_ + psWorkers_ + static_cast<int>(joined);
}

void Job::publishFailure(const std::string& what) {
  if (!store_) return;
  try {
    store_->setString(kFailedKey, what);
  } catch (const Error& e) {
    say(std::string("could not tell the other nodes: ") + e.what());
  }
}

void Job::watchRemoteFailure(const std::string& storeAddress, const std::string& token,
                             std::chrono::milliseconds timeout) {
  failureWatch_ = std::make_unique<FailureWatch>(storeAddress, token, kFailedKey, timeout);
}

void Job::checkRemoteFailure() {
  std::optional<FailureWatch::News> news = failureWatch_->news();
  if (!news) return;
  failureWatch_.reset();
  if (!failure_.empty()) return;  // this node's own failure, published (stopAfterDumps may still collect)
  if (news->storeLost) store_.reset();
  const std::string reason = news->what;
  say("stopping the ranks of node " + std::to_string(options_.nodeRank) + ": " + reason);
  exitCode_ = 1;
  failure_ = reason;
  beginStop(SIGTERM);
}

void Job::finishAcrossNodes(std::chrono::milliseconds timeout) {
  if (!store_) return;
  try {
    store_->add(kFinishedKey, 1);
    if (options_.nodeRank != 0) return;
    // After a failure the other nodes only need time to read it and stop their ranks.
    if (!failure_.empty())
      timeout = std::min<std::chrono::milliseconds>(timeout, options_.gracePeriod + 5s);
    auto deadline = Clock::now() + timeout;
    // Nodes that joined an elastic job later (--nnodes MIN:MAX) are waited for too.
    while (store_->add(kFinishedKey, 0) < std::max<int64_t>(options_.nnodes, store_->add(kNodesKey, 0)) &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(50ms);
  } catch (const Error& e) {
    say(std::string("store unavailable at the end of the job: ") + e.what());
  }
}

}  // namespace kolo::parallel::detail
