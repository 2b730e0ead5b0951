// What train::fit tells about its steps while it runs: the step-time breakdown of every
// rank (data, compute, communication, exposed communication, waiting for the slowest rank),
// exchanged every --metrics-every steps and written as an "interval" metrics line and on the
// progress line, and each rank's step and state in a status file that `kolo status` reads.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kolo/comm/communicator.h"
#include "kolo/observe.h"
#include "kolo/parallel/reducer.h"
#include "kolo/train/engine.h"
#include "kolo/train/fit.h"

namespace kolo::train::detail {

/// One rank's share of an interval, per step (seconds) unless said otherwise.
struct RankTimes {
  int rank = 0;
  int64_t steps = 0;
  double data = 0;         // waiting for the data loader
  double compute = 0;      // forward, backward, optimizer: the step less data and exposed time
  double comm = 0;         // all-reduce time, overlapped with backward or not
  double exposed = 0;      // communication that backward did not hide, less `wait`
  double wait = 0;         // waiting for slower ranks: the slowest rank's data + compute less
                           // this rank's, at most its exposed time
  double step = 0;         // the whole step
  double samplesPerSecond = 0;  // local samples over data + compute time (the rank's own pace)
  double commBytes = 0;    // bytes all-reduced per step
};

/// What the ranks exchanged at the end of an interval (known on every rank).
struct IntervalTimes {
  int64_t step = 0;  // steps done at the end of the interval
  std::vector<RankTimes> ranks;
  int slowest = 0;   // the rank with the most data + compute per step
  /// The interval's metrics fields: kind "interval", step, per-step means over the ranks
  /// (data_s, compute_s, comm_s, exposed_comm_s, wait_s, step_s), slowest_rank,
  /// comm_bytes, comm_gbps (bytes over all-reduce seconds less waiting), algorithm,
  /// ranks [...].
  observe::Fields fields(const std::string& algorithm) const;
  /// "step 12.3 ms: data 0.1 compute 9.0 comm 1.2 wait 2.0, slowest rank 1".
  std::string progressText() const;
};

class StepMonitor {
 public:
  /// `comm` null for one-process strategies. `every` >= 1 steps per interval.
  StepMonitor(comm::Communicator* comm, int64_t every, int64_t localBatch);
  /// Adds one step: seconds waiting for data, seconds of the whole step (data included),
  /// and the reducer of the step, whose timeline it reads; without one, `blockedSeconds` is
  /// the step's communication that nothing overlapped (comm::blockedSeconds).
  void record(double dataSeconds, double stepSeconds, const parallel::Reducer* reducer, double blockedSeconds = 0.0);
  /// After `stepsDone` steps: at the end of an interval, exchanges every rank's times
  /// (collective: every rank calls this after every step) and returns them; otherwise
  /// nothing.
  std::optional<IntervalTimes> endOfStep(int64_t stepsDone);

 private:
  comm::Communicator* comm_;
  int64_t every_;
  int64_t localBatch_;
  double sums_[6] = {};  // steps, data, step, comm, exposed, bytes
};

/// This rank's RankFigures over a fit: steady means of its step times, peaks of its memory.
class RankFiguresLog {
 public:
  explicit RankFiguresLog(int64_t tensorBase) : tensorBase_(tensorBase) {}
  /// One step: `figures` as the engine refined them, the step's seconds, the tensor bytes
  /// at its fullest (absolute), and whether it counts for the means (after timingSkip).
  void record(const StepFigures& figures, double stepSeconds, int64_t peakTensorBytes, bool steady);
  /// Every rank's figures in `comm`'s rank order (this rank's alone when null). Collective.
  std::vector<RankFigures> gather(comm::Communicator* comm) const;

 private:
  int64_t tensorBase_;
  RankFigures peaks_;
  double compute_[2] = {}, step_[2] = {};  // sums over the steady steps, over all
  int64_t steps_[2] = {};
};

/// The status file a trainer keeps: RunOptions::statusFile, else the one `kolo run
/// --status-file` passes through the environment (KOLO_STATUS_FILE), else "" (none).
std::string statusFileOf(const std::string& optionsStatusFile);

/// This rank's line in the status file: FILE.rank-N, rewritten atomically (a temporary file
/// renamed over it) at most twice a second and whenever the state changes; when destroyed
/// by an exception it writes state "failed". A path of "" turns it off.
class RankStatus {
 public:
  RankStatus(std::string file, int rank, int64_t totalSteps);
  ~RankStatus();
  RankStatus(const RankStatus&) = delete;
  RankStatus& operator=(const RankStatus&) = delete;
  /// state: "starting", "training", "evaluating", "checkpoint", "done"; a parameter-server
  /// job's servers "serving" and its chief "dispatching" (RankStatusLine::state).
  void update(const std::string& state, int64_t step, double loss = 0.0, double stepSeconds = 0.0,
              double samplesPerSecond = 0.0);
  /// The epoch under way (1-based), written with the next update.
  void setEpoch(int64_t epoch) { epoch_ = epoch; }
  /// Whether a file is kept (a path was given).
  bool kept() const { return !path_.empty(); }

 private:
  void write(const std::string& state);
  std::string path_;
  int rank_;
  int64_t totalSteps_;
  int uncaught_;
  std::string state_;
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  double loss_ = 0.0, stepSeconds_ = 0.0, samplesPerSecond_ = 0.0;
  std::chrono::steady_clock::time_point lastWrite_{};
};

}  // namespace kolo::train::detail
