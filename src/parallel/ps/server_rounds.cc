// The parameter server's update protocol (server_impl.h; its modes in the header's comment):
// a push applied as the mode says, sync rounds, SSP's bound on the fastest worker, the mean of
// a round and the optimizer step over the server's slices.
#include <algorithm>

#include "parallel/ps/server_impl.h"

namespace kolo::parallel::ps {

using namespace detail;

int64_t ParameterServer::Impl::push(int worker, int64_t basis, float* gradient, Reply& out,
                                    const void** reply) {
  std::unique_lock lock(mutex_);
  const int64_t staleness =
      stalenessOf(version_, basis, "worker " + std::to_string(worker), name());
  Worker& w = workers_[static_cast<size_t>(worker)];
  w.pushed = gradient;
  if (w.lost) KOLO_THROW(PeerError, name(), " dropped worker ", worker, " (no heartbeat)");
  if (w.left) {
    // Back from idling: in SSP it starts level with the slowest of the others, so that the
    // time it sat out does not hold everyone back.
    w.left = false;
    if (options_.mode == Mode::Ssp) w.clock = std::max(w.clock, slowestClock(worker));
  }
  ++stats_.pushes;
  stats_.bytesIn += wireBytes(out.bf16);
  const auto until = deadline();
  if (options_.mode == Mode::Sync) {
    w.parked = true;
    w.basis = basis;
    const int64_t round = version_;
    completeRoundIfReady();
    while (w.parked && !stopping_.load()) {
      if (changed_.wait_until(lock, until) == std::cv_status::timeout && w.parked)
        KOLO_THROW(Timeout, name(), ": sync round ", round, " waited ", options_.timeout.count(),
                   " ms for worker(s) ", missingWorkers());
    }
    if (stopping_.load()) KOLO_THROW(PeerError, name(), " is shutting down");
    if (w.lost) KOLO_THROW(PeerError, name(), " dropped worker ", worker, " (no heartbeat)");
    if (out.bf16) {
      const int64_t version = snapshot(out);
      *reply = out.data;
      return version;
    }
    // No copy: the next update needs this worker's next push, which cannot come before it
    // has read this reply, so the values stay as they are while they are sent, or while
    // the worker reads them in the shared file (other requests only read them).
    *reply = ownValues(out);
    return version_;
  }
  noteStaleness(staleness);
  if (options_.stalenessLr && staleness > 1) {
    const float scale = 1.0f / static_cast<float>(staleness);
    for (int64_t i = 0; i < elements_; ++i) gradient[i] *= scale;
  }
  applyUpdate(gradient);
  if (options_.mode == Mode::Ssp) {
    ++w.clock;
    changed_.notify_all();
    // The worker's next step would be number `clock`; it may start it only while it is at
    // most S pushes ahead of the slowest worker still in the job.
    while (w.clock - slowestClock(-1) > options_.staleness && !stopping_.load() && !w.lost) {
      if (changed_.wait_until(lock, until) == std::cv_status::timeout)
        KOLO_THROW(Timeout, name(), ": worker ", worker, " waited ", options_.timeout.count(),
                   " ms for the slowest worker (staleness bound ", options_.staleness, ")");
    }
    stats_.leadMax = std::max(stats_.leadMax, w.clock - slowestClock(-1));
  }
  const int64_t version = snapshot(out);
  *reply = out.data;
  return version;
}

int64_t ParameterServer::Impl::slowestClock(int except) const {
  int64_t slowest = INT64_MAX;
  for (size_t i = 0; i < workers_.size(); ++i)
    if (static_cast<int>(i) != except && inJob(workers_[i]))
      slowest = std::min(slowest, workers_[i].clock);
  if (slowest == INT64_MAX) return except >= 0 ? workers_[static_cast<size_t>(except)].clock : 0;
  return slowest;
}

std::string ParameterServer::Impl::missingWorkers() const {
  std::string list;
  for (size_t i = 0; i < workers_.size(); ++i)
    if (inJob(workers_[i]) && !workers_[i].parked)
      list += (list.empty() ? "" : ", ") + std::to_string(i);
  return list;
}

void ParameterServer::Impl::noteStaleness(int64_t staleness) {
  stats_.stalenessMax = std::max(stats_.stalenessMax, staleness);
  stats_.stalenessSum += staleness;
}

void ParameterServer::Impl::completeRoundIfReady() {
  if (options_.mode != Mode::Sync) return;
  std::vector<const float*> pushes;  // in worker order
  for (const Worker& w : workers_) {
    if (w.parked) {
      pushes.push_back(w.pushed);
    } else if (inJob(w)) {
      return;
    }
  }
  if (pushes.empty()) return;
  for (const Worker& w : workers_)
    if (w.parked) noteStaleness(version_ - w.basis);
  meanOf(pushes);
  applyUpdate(sum_.data());
  for (Worker& w : workers_) w.parked = false;
  changed_.notify_all();
}

void ParameterServer::Impl::meanOf(const std::vector<const float*>& pushes) {
  constexpr int64_t kBlock = 4096;
  const float count = static_cast<float>(pushes.size());
  for (int64_t begin = 0; begin < elements_; begin += kBlock) {
    const int64_t end = std::min(begin + kBlock, elements_);
    float* sum = sum_.data();
    std::copy(pushes[0] + begin, pushes[0] + end, sum + begin);
    for (size_t w = 1; w < pushes.size(); ++w)
      for (int64_t i = begin; i < end; ++i) sum[i] += pushes[w][i];
    if (pushes.size() > 1)
      for (int64_t i = begin; i < end; ++i) sum[i] /= count;
  }
}

void ParameterServer::Impl::applyUpdate(const float* gradient) {
  std::vector<optim::ParameterPart> parts;
  parts.reserve(slices_.size());
  for (size_t i = 0; i < slices_.size(); ++i)
    parts.push_back({0, slices_[i].size(), optim::Gradient{gradient + offsets_[i]}});
  if (lrAt_) optimizer_->setLr(lrAt_(version_));
  optimizer_->stepParts(parts);
  ++version_;
}

}  // namespace kolo::parallel::ps
