// What stops a fit early (fit_stopping.h): the checks after a step, and SIGTERM turned into a
// request that the ranks agree on at a step's end.
#include "train/fit_stopping.h"

#include <signal.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "kolo/error.h"
#include "kolo/numerics.h"

namespace kolo::train::detail {
namespace {

volatile std::sig_atomic_t gTerminateRequested = 0;

extern "C" void requestTerminate(int) { gTerminateRequested = 1; }

// The process's one SIGTERM handler, shared by every fit running in it.
std::mutex& handlerMutex() {
  static std::mutex m;
  return m;
}
int& handlerUsers() {
  static int n = 0;
  return n;
}
bool& handlerInstalled() {
  static bool b = false;
  return b;
}
struct sigaction& previousAction() {
  static struct sigaction p {};
  return p;
}
void restoreAction() {
  if (handlerInstalled()) ::sigaction(SIGTERM, &previousAction(), nullptr);
  handlerInstalled() = false;
}

}  // namespace

void checkStep(const FitOptions& options, Engine& engine, comm::Communicator* comm, int64_t step,
               double loss, double lr) {
  if (options.anomalyDetector) {
    if (comm && comm->size() > 1) options.anomalyDetector->agree(*comm);
    else options.anomalyDetector->throwIfFound();
  }
  if (options.checkSyncEvery > 0 && (step + 1) % options.checkSyncEvery == 0)
    observe::checkReplicasInSync(*comm, engine.model().stateDict(), step + 1);
  if (!std::isfinite(loss))
    KOLO_THROW(DivergedError, "training diverged: loss ", loss, " at step ", step, " (lr ", lr,
               "); try a smaller learning rate");
}

TerminateRequests::TerminateRequests(bool wanted) : wanted_(wanted) {
  if (!wanted_) return;
  std::lock_guard<std::mutex> lock(handlerMutex());
  if (handlerUsers()++ > 0) return;
  struct sigaction current {};
  if (::sigaction(SIGTERM, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) return;
  struct sigaction ask {};
  ask.sa_handler = requestTerminate;
  sigemptyset(&ask.sa_mask);
  ask.sa_flags = SA_RESTART;
  gTerminateRequested = 0;
  handlerInstalled() = ::sigaction(SIGTERM, &ask, &previousAction()) == 0;
}

TerminateRequests::~TerminateRequests() {
  if (!wanted_) return;
  std::lock_guard<std::mutex> lock(handlerMutex());
  if (--handlerUsers() == 0) restoreAction();
}

bool TerminateRequests::agreed(comm::Communicator* comm) const {
  if (!wanted_) return false;
  int32_t asked = gTerminateRequested ? 1 : 0;
  if (comm != nullptr && comm->size() > 1)
    comm->allreduce(&asked, &asked, 1, DType::I32, comm::ReduceOp::Max);
  return asked != 0;
}

void TerminateRequests::terminate() {
  {
    std::lock_guard<std::mutex> lock(handlerMutex());
    restoreAction();
  }
  std::fflush(nullptr);
  ::signal(SIGTERM, SIG_DFL);
  ::raise(SIGTERM);
  std::_Exit(128 + SIGTERM);  // not reached
}

}  // namespace kolo::train::detail
