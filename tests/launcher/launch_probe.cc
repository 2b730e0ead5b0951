// A rank program for the launcher tests. `launch_probe store`: reads its place with
// detectLaunch, checks in at the TCP store named by KOLO_STORE/KOLO_TOKEN and waits for
// every rank. `launch_probe allreduce`: initFromEnvironment, then an all-reduce of the
// ranks (expected n(n-1)/2). Prints one line describing what it saw; exits 1 on failure.
#include <cstdio>
#include <cstring>
#include <exception>

#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"

int main(int argc, char** argv) {
  using namespace kolo::comm;
  using namespace std::chrono_literals;
  std::string mode = argc > 1 ? argv[1] : "store";
  try {
    LaunchInfo info = detectLaunch();
    if (mode == "store") {
      auto store = connectTcpStore(info.storeAddress, info.token, 30s);
      store->add("probe/arrived", 1);
      store->setString("probe/rank/" + std::to_string(info.rank), std::to_string(info.localRank));
      std::vector<std::string> keys;
      for (int r = 0; r < info.size; ++r) keys.push_back("probe/rank/" + std::to_string(r));
      store->wait(keys, 30s);
      std::printf("probe rank=%d size=%d local=%d/%d launcher=%s arrived=%lld\n", info.rank,
                  info.size, info.localRank, info.localSize, info.launcher.c_str(),
                  static_cast<long long>(store->add("probe/arrived", 0)));
      return 0;
    }
    auto comm = initFromEnvironment();
    int64_t value = comm->rank();
    comm->allreduce(&value, &value, 1, kolo::DType::I64, ReduceOp::Sum);
    std::printf("allreduce rank=%d size=%d backend=%s sum=%lld\n", comm->rank(), comm->size(),
                comm->backendName().c_str(), static_cast<long long>(value));
    return value == int64_t{comm->size()} * (comm->size() - 1) / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "launch_probe: %s\n", e.what());
    return 1;
  }
}
