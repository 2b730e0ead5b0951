// The slow rank of --debug-slow-rank, a rank's share of the global batch and the re-plan of
// --balance (train_balance.h).
#include "train/balance.h"

#include <algorithm>
#include <cstdio>
#include <thread>

namespace kolo::train::detail {
namespace {

std::string joined(const std::vector<int64_t>& shares) {
  std::string text;
  for (int64_t s : shares) {
    if (!text.empty()) text += ',';
    text += std::to_string(s);
  }
  return text;
}

std::string joined(const std::vector<double>& seconds) {
  std::string text;
  char item[32];
  for (double s : seconds) {
    std::snprintf(item, sizeof(item), "%.3g", s);
    if (!text.empty()) text += ',';
    text += item;
  }
  return text;
}

}  // namespace

double SlowRank::sleepBeforeStep() const {
  if (pending_ <= 0.0) return 0.0;
  std::this_thread::sleep_for(std::chrono::duration<double>(pending_));
  return pending_;
}

double computeSeconds(double stepSeconds, const parallel::Reducer* reducer) {
  if (reducer)
    stepSeconds -= std::chrono::duration<double>(reducer->timeline().finalizeEnd -
                                                 reducer->timeline().finalizeStart)
                       .count();
  return std::max(stepSeconds, 0.0);
}

data::Batch shareOf(const data::Batch& globalBatch, int64_t offset, int64_t count) {
  data::Batch share;
  share.inputs = globalBatch.inputs.slice(0, offset, offset + count).contiguous();
  share.labels = globalBatch.labels.slice(0, offset, offset + count).contiguous();
  if (static_cast<int64_t>(globalBatch.indices.size()) >= offset + count)
    share.indices.assign(globalBatch.indices.begin() + offset, globalBatch.indices.begin() + offset + count);
  return share;
}

bool replanWhenDue(parallel::Balancer& balancer, comm::Communicator& comm, int64_t step,
                   bool primary, observe::Logger& logger, observe::MetricsWriter* metrics) {
  if (!balancer.replanDue() || !balancer.replan(comm)) return false;
  if (!primary) return true;
  logger.info("balance: new split", {{"step", step},
                                     {"shares", joined(balancer.shares())},
                                     {"seconds_per_sample", joined(balancer.secondsPerSample())}});
  if (metrics) {
    observe::Value::Array shares, seconds;
    for (int64_t s : balancer.shares()) shares.emplace_back(s);
    for (double s : balancer.secondsPerSample()) seconds.emplace_back(s);
    metrics->write({{"kind", "event"}, {"event", "balance"}, {"step", step},
                    {"shares", std::move(shares)}, {"seconds_per_sample", std::move(seconds)}});
  }
  return true;
}

}  // namespace kolo::train::detail
