// The chief's unit dispatcher and the workers' client of it. Units are handed out in order,
// one at a time per worker, so a worker twice as fast takes twice as many. A worker reports
// its unit done when it asks for the next one, after its last push of that unit has been
// answered; a worker whose connection drops holding a unit is lost and the unit goes back to
// the front of the queue, to whoever asks next. So is a worker that stops sending heartbeats
// on its second connection (a stopped process or hung host keeps its sockets open): the
// monitor thread closes its connection and tells the chief (which tells the servers). Sync
// workers take the units in cycles of equal ones (DispatchOptions::unitsAlike).
#include <sys/socket.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "parallel/ps/socket.h"
#include "parallel/ps/wire.h"

namespace kolo::parallel::ps {

using namespace detail;

namespace {
constexpr auto kRetryPause = std::chrono::milliseconds(2);
}  // namespace

class UnitDispatcher::Impl {
 public:
  explicit Impl(DispatchOptions options) : options_(std::move(options)), start_(Clock::now()) {
    KOLO_REQUIRE(options_.workers >= 1, "a parameter-server job needs at least 1 worker");
    KOLO_REQUIRE(options_.unitSamples >= 1, "DispatchOptions::unitSamples must be at least 1");
    KOLO_REQUIRE(options_.samplesPerEpoch >= 1, "an epoch needs at least one sample");
    KOLO_REQUIRE(options_.unitsAlike >= 1 && options_.samplesPerEpoch % options_.unitsAlike == 0 &&
                     options_.lastEpochSamples % options_.unitsAlike == 0,
                 "DispatchOptions::unitsAlike ", options_.unitsAlike, " does not divide an epoch's ",
                 options_.samplesPerEpoch, " samples and the last epoch's ", options_.lastEpochSamples);
    unitsPerEpoch_ = unitsIn(options_.samplesPerEpoch);
    KOLO_REQUIRE(options_.firstEpoch >= 0 && options_.firstEpoch <= options_.epochs, "first epoch ",
                 options_.firstEpoch, " is outside 0..", options_.epochs);
    KOLO_REQUIRE(options_.lastEpochSamples >= 0 &&
                     options_.lastEpochSamples <= options_.samplesPerEpoch,
                 "the last epoch's samples ", options_.lastEpochSamples, " are outside 0..",
                 options_.samplesPerEpoch);
    // Unit ids keep one epoch's stride (id / unitsPerEpoch_ is its epoch) when the last
    // epoch is shorter.
    for (int64_t e = options_.firstEpoch; e < options_.epochs; ++e)
      for (int64_t k = 0; k < unitsOf(e); ++k) queue_.push_back(e * unitsPerEpoch_ + k);
    allowedEpoch_ = options_.pauseBetweenEpochs ? options_.firstEpoch : INT64_MAX;
    done_.assign(static_cast<size_t>(options_.epochs), 0);
    lossSum_.assign(static_cast<size_t>(options_.epochs), 0.0);
    batches_.assign(static_cast<size_t>(options_.epochs), 0);
    // Epochs before the first were done by the run that wrote the checkpoint.
    for (int64_t e = 0; e < options_.firstEpoch; ++e)
      done_[static_cast<size_t>(e)] = unitsOf(e);
    finishedAt_.assign(static_cast<size_t>(options_.epochs), Clock::time_point{});
    workers_.resize(static_cast<size_t>(options_.workers));
    listener_ = detail::listenOn(options_.host, options_.port, &port_);
    lastProgress_ = Clock::now();
    acceptor_ = std::thread([this] { acceptLoop(); });
    if (options_.heartbeat.count() > 0) monitor_ = std::thread([this] { monitorLoop(); });
  }

  ~Impl() {
    stopping_ = true;
    if (monitor_.joinable()) monitor_.join();
    if (acceptor_.joinable()) acceptor_.join();
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

  uint16_t port() const { return port_; }

  EpochReport waitEpoch(int64_t epoch) {
    KOLO_CHECK(epoch >= 0 && epoch < options_.epochs, "epoch ", epoch);
    std::unique_lock lock(mutex_);
    const auto e = static_cast<size_t>(epoch);
    while (done_[e] < unitsOf(epoch)) {
      if (alive() == 0 && everConnected_)
        KOLO_THROW(PeerError, "every worker was lost; ", unitsOf(epoch) - done_[e],
                   " unit(s) of "
                   "epoch ",
                   epoch + 1, " are left undone");
      changed_.wait_for(lock, kPollSlice);
      if (Clock::now() - lastProgress_ > options_.timeout)
        KOLO_THROW(Timeout, "the chief: no worker finished a unit for ", options_.timeout.count(),
                   " ms (epoch ", epoch + 1, ", ", done_[e], " of ", unitsOf(epoch),
                   " units done)");
    }
    return {lossSum_[e], batches_[e],
            std::chrono::duration<double>(finishedAt_[e] - firstUnit_).count()};
  }

  void releaseEpoch(int64_t epoch) {
    std::lock_guard lock(mutex_);
    allowedEpoch_ = std::max(allowedEpoch_, epoch);
  }

  void waitWorkersFinished() {
    std::unique_lock lock(mutex_);
    const auto until = detail::deadlineAfter(options_.timeout);
    for (;;) {
      bool all = true;
      // A worker that never connected (it failed while starting) has nothing to be told.
      for (const Worker& w : workers_) all = all && (w.told || w.lost || !w.connected);
      if (all) return;
      if (changed_.wait_until(lock, until) == std::cv_status::timeout)
        KOLO_THROW(Timeout, "the chief: workers did not ask for their last unit within ",
                   options_.timeout.count(), " ms");
    }
  }

  std::vector<LostWorker> lost() const {
    std::lock_guard lock(mutex_);
    return lost_;
  }

  int workersAlive() const {
    std::lock_guard lock(mutex_);
    return alive();
  }

  std::vector<int64_t> unitsDone() const {
    std::lock_guard lock(mutex_);
    std::vector<int64_t> counts;
    for (const Worker& w : workers_) counts.push_back(w.units);
    return counts;
  }

 private:
  struct Worker {
    bool connected = false;
    bool lost = false;
    bool told = false;  // was answered Finished
    int64_t held = -1;
    int64_t units = 0;
    int fd = -1;             // its unit connection while served (shut down when it is lost)
    bool beating = false;    // it has a heartbeat connection
    int beatFd = -1;         // that connection while served
    Clock::time_point beat;  // its last heartbeat
  };

  /// Workers not lost: the W the job started with, and those that joined.
  int alive() const {
    int n = 0;
    for (size_t i = 0; i < workers_.size(); ++i)
      n +=
          !workers_[i].lost && (i < static_cast<size_t>(options_.workers) || workers_[i].connected);
    return n;
  }

  double secondsSinceStart() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

  void acceptLoop() {
    while (!stopping_.load()) {
      Socket socket = detail::acceptFor(listener_, kPollSlice);
      if (!socket.valid()) continue;
      threads_.emplace_back([this, s = std::move(socket)]() mutable { serve(s); });
    }
  }

  /// Declares workers lost whose heartbeats stopped; tells the chief outside the lock.
  /// Silence counts only while the monitor watches: when the chief itself was not scheduled
  /// (a loaded machine), the time it missed is not held against the workers, and a worker
  /// whose heartbeat waits unread in its socket is alive.
  void monitorLoop() {
    auto watched = Clock::now();
    while (!stopping_.load()) {
      std::this_thread::sleep_for(kPollSlice);
      std::vector<int> silent;
      {
        std::lock_guard lock(mutex_);
        const auto now = Clock::now();
        const auto missed = now - watched - kPollSlice;
        watched = now;
        if (missed > kPollSlice)
          for (Worker& w : workers_) w.beat += missed;
        for (size_t i = 0; i < workers_.size(); ++i) {
          Worker& w = workers_[i];
          if (!w.beating || w.lost || w.told || now - w.beat <= options_.heartbeat) continue;
          if (w.beatFd >= 0 && detail::bytesWaiting(w.beatFd)) {
            w.beat = now;
            continue;
          }
          markLost(static_cast<int>(i), true);
          if (w.fd >= 0) ::shutdown(w.fd, SHUT_RDWR);
          silent.push_back(static_cast<int>(i));
        }
        if (!silent.empty()) changed_.notify_all();
      }
      for (int worker : silent) {
        if (!options_.onLost) continue;
        try {
          options_.onLost(worker);
        } catch (const Error&) {
          // A server that cannot be told is gone: the job stops on that elsewhere.
        }
      }
    }
  }

  /// Under the lock: `worker` is lost; the unit it held goes to the front of the queue.
  void markLost(int worker, bool heartbeat) {
    Worker& w = workers_[static_cast<size_t>(worker)];
    w.lost = true;
    lost_.push_back({worker, secondsSinceStart(), w.held, heartbeat});
    if (w.held >= 0) queue_.push_front(w.held);
    w.held = -1;
  }

  /// A worker's heartbeat connection: each message renews its deadline.
  void serveHeartbeats(Socket& socket, int worker) {
    const Header ok = detail::reply(Status::Ok);
    socket.sendAll(&ok, sizeof ok, detail::deadlineAfter(options_.timeout), "the hello reply");
    {
      std::lock_guard lock(mutex_);
      Worker& w = workers_[static_cast<size_t>(worker)];
      w.beating = true;
      w.beatFd = socket.fd();
      w.beat = Clock::now();
    }
    struct Forget {  // the descriptor is closed with the socket, after this function
      Impl* self;
      int worker;
      ~Forget() {
        std::lock_guard lock(self->mutex_);
        self->workers_[static_cast<size_t>(worker)].beatFd = -1;
      }
    } forget{this, worker};
    while (!stopping_.load()) {
      if (!socket.waitReadable(kPollSlice)) continue;
      const Header h =
          detail::recvHeader(socket, detail::deadlineAfter(options_.timeout), "a heartbeat");
      if (h.op != static_cast<uint32_t>(Op::Heartbeat) || h.payload != 0)
        KOLO_THROW(FormatError, socket.peer(), " sent request ", h.op,
                   " on its heartbeat connection");
      std::lock_guard lock(mutex_);
      Worker& w = workers_[static_cast<size_t>(worker)];
      if (w.lost) return;
      w.beat = Clock::now();
    }
  }

  void serve(Socket& socket) {
    int worker = -1;
    const auto deadline = [this] { return detail::deadlineAfter(options_.timeout); };
    try {
      const Header h = detail::acceptHello(socket, options_.token, deadline());
      if (h.a == kHeartbeatHello) {
        {
          std::lock_guard lock(mutex_);
          while (h.index < kMaxWorkers && workers_.size() <= h.index) workers_.emplace_back();
          if (h.index >= workers_.size() || workers_[h.index].beating ||
              workers_[h.index].lost) {
            detail::sendError(
                socket, "the chief does not expect heartbeats of worker " + std::to_string(h.index),
                deadline());
            return;
          }
        }
        socket.setPeer("worker " + std::to_string(h.index) + " (heartbeats)");
        serveHeartbeats(socket, static_cast<int>(h.index));
        return;
      }
      {
        std::lock_guard lock(mutex_);
        // Workers beyond the W the job started with join later (kolo run --join); they get
        // units from their first request on.
        while (h.index < kMaxWorkers && workers_.size() <= h.index) workers_.emplace_back();
        if (h.index >= workers_.size() || workers_[h.index].connected) {
          detail::sendError(socket, "the chief does not expect worker " + std::to_string(h.index),
                            deadline());
          return;
        }
        worker = static_cast<int>(h.index);
        workers_[h.index].connected = true;
        workers_[h.index].fd = socket.fd();
        everConnected_ = true;
        // A worker connects once it has loaded its data (slow on a loaded machine): the
        // chief's no-progress deadline counts from the newest connection on.
        lastProgress_ = Clock::now();
      }
      socket.setPeer("worker " + std::to_string(worker));
      const Header ok = detail::reply(Status::Ok);
      socket.sendAll(&ok, sizeof ok, deadline(), "the hello reply");
      while (!stopping_.load()) {
        if (!socket.waitReadable(kPollSlice)) continue;
        const Header request = detail::recvHeader(socket, deadline(), "a unit request");
        {
          std::lock_guard lock(mutex_);
          detail::checkUnitRequest(request, workers_[static_cast<size_t>(worker)].held,
                                   options_.unitSamples, socket.peer());
        }
        double lossSum = 0.0;
        socket.recvAll(&lossSum, sizeof lossSum, deadline(), "the unit report");
        const Header answer = next(worker, request.a, request.b, lossSum);
        int64_t range[2] = {0, 0};
        if (answer.op == static_cast<uint32_t>(Status::Ok)) {
          const auto [begin, end] = rangeOf(samplesOf(answer.a / unitsPerEpoch_), answer.a % unitsPerEpoch_);
          range[0] = begin;
          range[1] = end;
        }
        iovec parts[2] = {{const_cast<Header*>(&answer), sizeof answer}, {range, answer.payload}};
        socket.sendAll(parts, 2, deadline(), "the next unit");
      }
    } catch (const Error&) {
      // The worker is gone (or spoke nonsense): handled below like a lost connection.
    }
    if (worker < 0) return;
    std::lock_guard lock(mutex_);
    Worker& w = workers_[static_cast<size_t>(worker)];
    w.fd = -1;
    if (!w.told && !w.lost && !stopping_.load()) markLost(worker, false);
    changed_.notify_all();
  }

  Header next(int worker, int64_t completed, int64_t batches, double lossSum) {
    std::lock_guard lock(mutex_);
    Worker& w = workers_[static_cast<size_t>(worker)];
    if (w.lost)
      KOLO_THROW(PeerError, "worker ", worker,
                 " was declared lost (no heartbeat): its units went to the others");
    w.beat = std::max(w.beat, Clock::now());  // a request is as good as a heartbeat
    if (completed >= 0) {
      KOLO_CHECK_EQ(completed, w.held, "worker ", worker, " reported a unit it does not hold");
      const auto epoch = static_cast<size_t>(completed / unitsPerEpoch_);
      ++done_[epoch];
      lossSum_[epoch] += lossSum;
      batches_[epoch] += batches;
      ++w.units;
      if (done_[epoch] == unitsOf(static_cast<int64_t>(epoch))) finishedAt_[epoch] = Clock::now();
      w.held = -1;
      lastProgress_ = Clock::now();
      changed_.notify_all();
    }
    if (!queue_.empty() && queue_.front() / unitsPerEpoch_ > allowedEpoch_)
      return detail::reply(Status::Wait);
    if (!queue_.empty()) {
      if (!handedOut_) firstUnit_ = Clock::now();
      handedOut_ = true;
      w.held = queue_.front();
      queue_.pop_front();
      return detail::reply(Status::Ok, w.held, w.held / unitsPerEpoch_, 2 * sizeof(int64_t));
    }
    bool allDone = true;
    for (size_t e = 0; e < done_.size(); ++e)
      allDone = allDone && done_[e] == unitsOf(static_cast<int64_t>(e));
    if (!allDone) return detail::reply(Status::Wait);
    w.told = true;
    changed_.notify_all();
    return detail::reply(Status::Finished);
  }

  DispatchOptions options_;
  Clock::time_point start_;
  /// Samples of epoch `epoch` in use: the whole epoch's, or lastEpochSamples for the last.
  int64_t samplesOf(int64_t epoch) const {
    const bool shortLast = epoch + 1 == options_.epochs && options_.lastEpochSamples > 0;
    return shortLast ? options_.lastEpochSamples : options_.samplesPerEpoch;
  }
  int64_t unitsOf(int64_t epoch) const { return unitsIn(samplesOf(epoch)); }
  /// An epoch of `samples` samples: cycles of unitsAlike units of unitSamples, then, for what
  /// is left, unitsAlike equal units (none when nothing is).
  int64_t wholeUnitsIn(int64_t samples) const {
    return samples / (options_.unitSamples * options_.unitsAlike) * options_.unitsAlike;
  }
  int64_t unitsIn(int64_t samples) const {
    const int64_t whole = wholeUnitsIn(samples);
    return whole + (samples > whole * options_.unitSamples ? options_.unitsAlike : 0);
  }
  /// Samples [begin, end) of unit `k` of an epoch of `samples` samples.
  std::pair<int64_t, int64_t> rangeOf(int64_t samples, int64_t k) const {
    const int64_t whole = wholeUnitsIn(samples);
    if (k < whole) return {k * options_.unitSamples, (k + 1) * options_.unitSamples};
    const int64_t shorter = (samples - whole * options_.unitSamples) / options_.unitsAlike;
    const int64_t begin = whole * options_.unitSamples + (k - whole) * shorter;
    return {begin, begin + shorter};
  }

  int64_t unitsPerEpoch_ = 0;
  Socket listener_;
  uint16_t port_ = 0;
  std::thread acceptor_;
  std::thread monitor_;
  std::vector<std::thread> threads_;  // touched by the acceptor only, joined after it
  std::atomic<bool> stopping_{false};

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<int64_t> queue_;
  std::vector<int64_t> done_;
  std::vector<double> lossSum_;
  std::vector<int64_t> batches_;
  std::vector<Clock::time_point> finishedAt_;
  Clock::time_point firstUnit_;
  bool handedOut_ = false;
  int64_t allowedEpoch_ = INT64_MAX;
  std::deque<Worker> workers_;  // references stay valid as joiners are added
  std::vector<LostWorker> lost_;
  bool everConnected_ = false;
  Clock::time_point lastProgress_;
};

UnitDispatcher::UnitDispatcher(DispatchOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}
UnitDispatcher::~UnitDispatcher() = default;
uint16_t UnitDispatcher::port() const { return impl_->port(); }
EpochReport UnitDispatcher::waitEpoch(int64_t epoch) { return impl_->waitEpoch(epoch); }
void UnitDispatcher::releaseEpoch(int64_t epoch) { impl_->releaseEpoch(epoch); }
void UnitDispatcher::waitWorkersFinished() { impl_->waitWorkersFinished(); }
std::vector<LostWorker> UnitDispatcher::lost() const { return impl_->lost(); }
int UnitDispatcher::workersAlive() const { return impl_->workersAlive(); }
std::vector<int64_t> UnitDispatcher::unitsDone() const { return impl_->unitsDone(); }

struct UnitClient::State {
  Socket socket;
  Millis timeout;
  // The heartbeat thread and its connection.
  Socket beats;
  std::thread beater;
  std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
};

UnitClient::UnitClient(const std::string& address, int worker, const std::string& token,
                       Millis timeout, Millis heartbeat)
    : state_(std::make_unique<State>()) {
  state_->timeout = timeout;
  const auto until = detail::deadlineAfter(timeout);
  state_->socket = detail::connectTo(address, until, "the chief (" + address + ")");
  detail::hello(state_->socket, static_cast<uint32_t>(worker),
                static_cast<int64_t>(ClientRole::Worker), token, until);
  if (heartbeat.count() <= 0) return;
  state_->beats = detail::connectTo(address, until, "the chief (" + address + ")");
  detail::hello(state_->beats, static_cast<uint32_t>(worker), kHeartbeatHello, token, until);
  const Millis every = std::max(Millis{1}, heartbeat / 4);
  state_->beater = std::thread([state = state_.get(), every] {
    std::unique_lock lock(state->mutex);
    while (!state->wake.wait_for(lock, every, [state] { return state->stopping; })) {
      try {
        const Header h = detail::request(Op::Heartbeat);
        state->beats.sendAll(&h, sizeof h, detail::deadlineAfter(state->timeout), "a heartbeat");
      } catch (const Error&) {
        return;  // the chief is gone or dropped this worker: the unit connection says so
      }
    }
  });
}

UnitClient::~UnitClient() {
  if (!state_->beater.joinable()) return;
  {
    std::lock_guard lock(state_->mutex);
    state_->stopping = true;
  }
  state_->wake.notify_all();
  state_->beater.join();
}

std::optional<Unit> UnitClient::next(const UnitReport& report, const std::function<void()>& idle) {
  Socket& socket = state_->socket;
  UnitReport pending = report;
  bool idled = false;
  const auto giveUp = detail::deadlineAfter(state_->timeout);
  for (;;) {
    const auto until = detail::deadlineAfter(state_->timeout);
    Header h = detail::request(Op::Next, pending.completed, pending.batches, sizeof(double));
    iovec parts[2] = {{&h, sizeof h}, {&pending.lossSum, sizeof(double)}};
    socket.sendAll(parts, 2, until, "a unit request");
    const Header answer = detail::recvHeader(socket, until, "the next unit");
    pending = UnitReport{};  // reported once
    switch (static_cast<Status>(answer.op)) {
      case Status::Ok: {
        int64_t range[2];
        if (answer.payload != sizeof range)
          KOLO_THROW(FormatError, socket.peer(), " sent a unit of ", answer.payload, " bytes");
        socket.recvAll(range, sizeof range, until, "the next unit");
        detail::checkUnitReply(answer, range, socket.peer());
        return Unit{answer.a, answer.b, range[0], range[1]};
      }
      case Status::Finished:
        return std::nullopt;
      case Status::Wait:
        if (!idled && idle) idle();
        idled = true;
        if (Clock::now() > giveUp)
          KOLO_THROW(Timeout, "worker waited ", state_->timeout.count(),
                     " ms for a unit from the chief");
        std::this_thread::sleep_for(kRetryPause);
        continue;
      case Status::Error:
        detail::throwRemoteError(socket, answer, until);
      default:
        KOLO_THROW(FormatError, socket.peer(), " answered with status ", answer.op);
    }
  }
}

}  // namespace kolo::parallel::ps
