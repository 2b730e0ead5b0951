// FaultPlan: the text forms of the faults, and fit's callbacks that carry them out.
#include "kolo/train/faults.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <sstream>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

#include "kolo/autograd.h"
#include "kolo/comm/store.h"
#include "kolo/error.h"
#include "kolo/parallel/elastic.h"
#include "kolo/train/elastic.h"
#include "train/balance.h"

namespace kolo::train {
namespace {

std::vector<std::string> splitAt(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::istringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  if (!text.empty() && text.back() == separator) parts.emplace_back();
  return parts;
}

// A whole number >= 0 filling all of `text`; throws InvalidArgument naming `what`, the
// whole `value` and the `form` otherwise.
int64_t whole(const std::string& text, const std::string& what, const std::string& value, const char* form) {
  size_t used = 0;
  int64_t number = -1;
  try {
    number = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KOLO_REQUIRE(!text.empty() && used == text.size() && number >= 0, what, " '", value, "' is not accepted: use ",
               form);
  return number;
}

// Where a member killed by injectElasticFaults records the moment of its kill.
constexpr const char* kKillMomentKey = "kolo-elastic/debug-kill-ns";

int64_t wallNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// plan.elastic.sampleLog's file of one member.
class SampleLog {
 public:
  SampleLog(const std::string& prefix, int id) {
    if (prefix.empty()) return;
    const std::string path = prefix + ".rank-" + std::to_string(id);
    out_.open(path, std::ios::trunc);
    KOLO_REQUIRE(out_.good(), "the elastic sample log: cannot write ", path);
    out_ << "pid " << ::getpid() << '\n' << std::flush;  // one process throughout
  }
  void write(ElasticEngine& engine, const StepEnd& end) {
    if (!out_.is_open()) return;
    // Balanced: the whole global batch was loaded; this member trained on its share.
    const std::vector<int64_t>& loaded = end.batch->indices;
    const parallel::Balancer* balancer = engine.balancer();
    const auto first = loaded.begin() + (balancer ? balancer->offset() : 0);
    const auto last = balancer ? first + balancer->share() : loaded.end();
    out_ << engine.context().generation() << ' ' << end.step;
    for (auto index = first; index != last; ++index) out_ << ' ' << *index;
    out_ << '\n' << std::flush;
  }

 private:
  std::ofstream out_;
};

}  // namespace

FaultPlan::Kill FaultPlan::parseKill(const std::string& text, const std::string& what) {
  const char* form = "RANK[,RANK...]:STEP[:KILL|:STOP], e.g. 3:5, 1,2:5 or 3:40:STOP";
  const std::vector<std::string> parts = splitAt(text, ':');
  KOLO_REQUIRE(parts.size() == 2 || parts.size() == 3, what, " '", text, "' is not accepted: use ", form);
  Kill kill;
  for (const std::string& rank : splitAt(parts[0], ','))
    kill.ranks.push_back(static_cast<int>(whole(rank, what, text, form)));
  kill.step = whole(parts[1], what, text, form);
  if (parts.size() == 3) {
    KOLO_REQUIRE(parts[2] == "KILL" || parts[2] == "STOP", what, " '", text, "' is not accepted: use ", form);
    kill.signal = parts[2] == "STOP" ? SIGSTOP : SIGKILL;
  }
  return kill;
}

FaultPlan::Fail FaultPlan::parseFail(const std::string& text, const std::string& what) {
  const char* form = "STEP or STEP:RANK";
  const std::vector<std::string> parts = splitAt(text, ':');
  KOLO_REQUIRE(parts.size() == 1 || parts.size() == 2, what, " '", text, "' is not accepted: use ", form);
  return {.rank = parts.size() == 2 ? static_cast<int>(whole(parts[1], what, text, form)) : 0,
          .step = whole(parts[0], what, text, form)};
}

FaultPlan::Slow FaultPlan::parseSlow(const std::string& text, const std::string& what) {
  const char* form = "RANK:FACTOR, e.g. 0:2 (a factor of at least 1)";
  const std::vector<std::string> parts = splitAt(text, ':');
  KOLO_REQUIRE(parts.size() == 2, what, " '", text, "' is not accepted: use ", form);
  Slow slow{.rank = static_cast<int>(whole(parts[0], what, text, form))};
  size_t used = 0;
  try {
    slow.factor = std::stod(parts[1], &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KOLO_REQUIRE(used > 0 && used == parts[1].size() && slow.factor >= 1.0, what, " '", text,
               "' is not accepted: use ", form);
  return slow;
}

FaultPlan::Nan FaultPlan::parseNan(const std::string& text, const std::string& what) {
  const char* form = "STEP:RANK:MODULE or STEP:RANK:MODULE:grad, e.g. 5:1:2";
  const std::vector<std::string> parts = splitAt(text, ':');
  KOLO_REQUIRE((parts.size() == 3 || (parts.size() == 4 && parts[3] == "grad")) && !parts[2].empty(), what,
               " '", text, "' is not accepted: use ", form);
  return {.rank = static_cast<int>(whole(parts[1], what, text, form)),
          .step = whole(parts[0], what, text, form),
          .module = parts[2],
          .gradient = parts.size() == 4};
}

FaultPlan::Perturb FaultPlan::parsePerturb(const std::string& text, const std::string& what) {
  const char* form = "STEP:RANK:TENSOR, e.g. 3:1:0.weight";
  const std::vector<std::string> parts = splitAt(text, ':');
  KOLO_REQUIRE(parts.size() == 3 && !parts[2].empty(), what, " '", text, "' is not accepted: use ", form);
  return {.rank = static_cast<int>(whole(parts[1], what, text, form)),
          .step = whole(parts[0], what, text, form),
          .tensor = parts[2]};
}

void FaultPlan::strike(int rank, int64_t step, const char* unit) const {
  if (step == kill.step && std::find(kill.ranks.begin(), kill.ranks.end(), rank) != kill.ranks.end()) {
    std::fflush(nullptr);
    ::raise(kill.signal);
  }
  if (step == fail.step && rank == fail.rank)
    KOLO_THROW(Error, "rank ", rank, ": failure injected before ", unit, " ", step);
}

FitCallbacks injectFaults(const FaultPlan& plan, int rank, FitCallbacks inner, nn::Module* model,
                          observe::AnomalyDetector* detector) {
  if (plan.nan.step >= 0) {
    KOLO_REQUIRE(detector != nullptr, "a NaN injected at step ", plan.nan.step,
                 " needs an anomaly detector to find it (FitOptions::anomalyDetector)");
    if (rank == plan.nan.rank)
      detector->injectNan(plan.nan.step, plan.nan.module,
                          plan.nan.gradient ? observe::AnomalyPhase::OutputGradient
                                            : observe::AnomalyPhase::ForwardOutput);
  }
  if (plan.perturb.step >= 0) {
    KOLO_REQUIRE(model != nullptr, "a weight perturbed at step ", plan.perturb.step, " needs the model");
    std::string names;
    bool known = false;
    for (const auto& [name, tensor] : model->stateDict()) {
      known = known || name == plan.perturb.tensor;
      names += (names.empty() ? "" : ", ") + name;
    }
    KOLO_REQUIRE(known, "the model has no tensor '", plan.perturb.tensor, "' to perturb; it has ", names);
  }
  auto slow = std::make_shared<detail::SlowRank>(plan.slow.rank, rank, plan.slow.factor);
  FitCallbacks callbacks = inner;
  callbacks.onStepBegin = [plan, rank, model, slow, begin = inner.onStepBegin](int64_t step) {
    if (step == plan.perturb.step && rank == plan.perturb.rank) {
      // A change by hand that data parallelism cannot undo: every rank applies the same
      // averaged update, so the difference stays.
      autograd::NoGradGuard noGrad;
      for (auto& [name, tensor] : model->stateDict()) {
        if (name != plan.perturb.tensor) continue;
        Tensor shifted = tensor.clone();
        shifted.data<float>()[0] += 1e-3f;
        tensor.copyFrom(shifted);
      }
    }
    plan.strike(rank, step);
    slow->sleepBeforeStep();
    if (begin) begin(step);
  };
  callbacks.onStepEnd = [slow, end = inner.onStepEnd](const StepEnd& step) {
    slow->computed(step.computeSeconds);
    if (end) end(step);
  };
  return callbacks;
}

std::function<void(int64_t)> killInRegroup(const FaultPlan& plan, int id) {
  if (plan.elastic.killInRegroup < 0 || plan.elastic.killInRegroup != id) return nullptr;
  return [](int64_t) {
    std::fflush(nullptr);
    ::raise(SIGKILL);
  };
}

FitCallbacks injectElasticFaults(const FaultPlan& plan, ElasticEngine& engine, FitCallbacks inner) {
  parallel::ElasticContext& context = engine.context();
  const int id = context.id();
  const FaultPlan::Kill kill = plan.kill;
  const int64_t awaitJoinAt = plan.elastic.awaitJoinAt;
  FitCallbacks hooks = inner;
  hooks.onStepBegin = [kill, awaitJoinAt, &context, id, begin = inner.onStepBegin](int64_t step) {
    if (step == kill.step && std::find(kill.ranks.begin(), kill.ranks.end(), id) != kill.ranks.end()) {
      std::fflush(nullptr);
      context.store()->setString(kKillMomentKey, std::to_string(wallNanos()));
      ::raise(kill.signal);
    }
    if (step == awaitJoinAt && context.size() < context.maxRanks()) context.awaitJoiners(std::chrono::minutes(5));
    if (begin) begin(step);
  };
  auto sampleLog = std::make_shared<SampleLog>(plan.elastic.sampleLog, id);
  hooks.onStepEnd = [sampleLog, &engine, end = inner.onStepEnd](const StepEnd& step) {
    sampleLog->write(engine, step);
    if (end) end(step);
  };
  FaultPlan others = plan;
  others.kill = {};  // the hook above's
  return injectFaults(others, id, hooks);
}

std::function<void(observe::Fields&)> sinceKillField(std::shared_ptr<comm::Store> store) {
  return [store = std::move(store)](observe::Fields& fields) {
    if (!store->check({kKillMomentKey})) return;
    const int64_t killed = std::stoll(store->getString(kKillMomentKey, std::chrono::seconds(1)));
    fields.set("since_kill_s", static_cast<double>(wallNanos() - killed) / 1e9);
  };
}

}  // namespace kolo::train
