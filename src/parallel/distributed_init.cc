// parallel::init(): Horovod's hvd.init() over comm::initFromEnvironment, in its own unit
// so that programs that never call it do not link the environment detection.
#include "kolo/comm/init.h"
#include "kolo/parallel/distributed.h"

namespace kolo::parallel {

std::shared_ptr<comm::Communicator> init(const comm::InitOptions& options) {
  return comm::initFromEnvironment(options);
}

}  // namespace kolo::parallel
