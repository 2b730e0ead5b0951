// Roles of a parameter-server job: what `kolo run --ps P --workers W` tells each process
// (KOLO_ROLE, KOLO_ROLE_INDEX, KOLO_PS_SERVERS, KOLO_PS_WORKERS), or, under mpirun / srun,
// what the rank says with KOLO_PS_SERVERS given; and where the servers and the chief publish
// their addresses in the job's store.
#include "parallel/ps/store_keys.h"
#include "kolo/comm/init.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/settings.h"

namespace kolo::parallel::ps {

RoleInfo roleFromEnvironment() {
  const settings::Environment env = settings::Environment::process();
  const std::string role = settings::role(env);
  RoleInfo info;
  if (role.empty()) {
    // Started by another launcher: the rank decides, servers first, then the chief, then the
    // workers (the order kolo run --ps uses too).
    const auto servers = settings::psServers(env);
    const comm::LaunchInfo launch = comm::detectLaunch(env.variables());
    KOLO_REQUIRE(servers && launch.launcher != "single",
                 "this process has no parameter-server role: KOLO_ROLE is not set (kolo's launcher of "
                 "P servers and W workers sets it), nor KOLO_PS_SERVERS=P under mpirun / srun (the "
                 "rank then decides the role); ParameterServerOptions::role names a role without "
                 "either");
    info.servers = static_cast<int>(*servers);
    info.workers = launch.size - info.servers - 1;
    KOLO_REQUIRE(info.servers >= 1 && info.workers >= 1, "KOLO_PS_SERVERS=", info.servers,
                 " in a job of ", launch.size, " ranks leaves ", info.workers,
                 " workers: start at least P + 2 ranks");
    if (launch.rank < info.servers) {
      info.role = Role::Server;
      info.index = launch.rank;
    } else if (launch.rank == info.servers) {
      info.role = Role::Chief;
    } else {
      info.role = Role::Worker;
      info.index = launch.rank - info.servers - 1;
    }
    // Only kolo run's store is up before the job starts; under torchrun's or Slurm's
    // variables the job boots its own (bootstrapStore, through the job's communicator).
    if (launch.launcher == "kolo") {
      info.store = launch.storeAddress;
      info.token = launch.token;
    }
    // Whether every rank shares this host is for bootstrapStore to find out (host names).
    info.local = false;
    return info;
  }
  if (role == "ps") {
    info.role = Role::Server;
  } else if (role == "worker") {
    info.role = Role::Worker;
  } else if (role == "chief") {
    info.role = Role::Chief;
  } else {
    KOLO_THROW(InvalidArgument, "KOLO_ROLE='", role, "' is not accepted: use ps, worker or chief");
  }
  const auto index = settings::roleIndex(env);
  const auto servers = settings::psServers(env);
  const auto workers = settings::psWorkers(env);
  KOLO_REQUIRE(index && servers && workers,
               "KOLO_ROLE_INDEX, KOLO_PS_SERVERS and KOLO_PS_WORKERS must be set with KOLO_ROLE "
               "(kolo's launcher of P servers and W workers sets them)");
  info.index = static_cast<int>(*index);
  info.servers = static_cast<int>(*servers);
  info.workers = static_cast<int>(*workers);
  KOLO_REQUIRE(info.servers >= 1 && info.workers >= 1,
               "KOLO_PS_SERVERS and KOLO_PS_WORKERS must "
               "be at least 1, got ",
               info.servers, " and ", info.workers);
  // Workers beyond W joined the job later (kolo run --join).
  const int count = info.role == Role::Server   ? info.servers
                    : info.role == Role::Worker ? INT32_MAX
                                                : 1;
  KOLO_REQUIRE(info.index >= 0 && info.index < count, "KOLO_ROLE_INDEX ", info.index,
               " is outside 0..", count - 1, " for role ", role);
  info.store = settings::store(env);
  info.token = settings::token(env);
  KOLO_REQUIRE(!info.store.empty(), "KOLO_STORE is not set (kolo's launcher sets it)");
  info.local = true;
  return info;
}

std::string serverAddressKey(int server) { return "ps/server/" + std::to_string(server); }

std::string chiefAddressKey() { return "ps/chief"; }

std::string shapeKey() { return "ps/shape"; }

std::string joinCounterKey() { return "ps/joined"; }

std::string finishedKey() { return "ps/finished"; }

std::string workerBuffersKey(int worker) { return "ps/buffers/" + std::to_string(worker); }

std::string startBuffersKey() { return "ps/buffers/start"; }

std::string localHost(comm::Store& store) {
  if (auto* tcp = dynamic_cast<comm::TcpStoreClient*>(&store)) return tcp->localAddress();
  return "127.0.0.1";
}

}  // namespace kolo::parallel::ps
