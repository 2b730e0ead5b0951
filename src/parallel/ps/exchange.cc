// A worker's push-and-pull, in place (sync) or overlapped with the next step's compute
// (async, ssp): two replicas of the parameters take turns, one computing while the other's
// exchange runs on a thread of its own. The protocol with the servers is ServerGroup's,
// unchanged: one push at a time, each answered by the values to go on with. In place, the
// replica's gradients live in the shared segments of the servers on this host, and with sync
// servers its values are theirs.
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"

namespace kolo::parallel::ps {

class WorkerExchange::Impl {
 public:
  Impl(ServerGroup& servers, std::vector<NamedTensors> replicas, double lookahead)
      : servers_(servers),
        replicas_(std::move(replicas)),
        versions_(replicas_.size(), 0),
        lookahead_(static_cast<float>(lookahead)) {
    KOLO_REQUIRE(replicas_.size() == 1 || replicas_.size() == 2,
                 "a worker exchange takes one replica of the parameters (in place) or two "
                 "(overlapped), got ",
                 replicas_.size());
    KOLO_REQUIRE(lookahead >= 0.0 && (lookahead == 0.0 || replicas_.size() == 2),
                 "a worker exchange looks ahead only when overlapped, by a factor of at least "
                 "0, got ", lookahead);
    // In place, the one replica's gradients can be computed straight into the shared
    // segments (each push waits for its reply before the next backward writes them again),
    // and with sync servers it can compute on their values themselves.
    if (overlapped()) {
      thread_ = std::thread([this] { runExchanges(); });
    } else {
      servers_.placeGradients(replicas_[0]);
      servers_.placeValues(replicas_[0]);
    }
  }

  ~Impl() {
    if (!thread_.joinable()) return;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      finished_.wait(lock, [this] { return inFlight_ < 0 || done_; });
      stopping_ = true;
    }
    started_.notify_all();
    thread_.join();
  }

  bool overlapped() const { return replicas_.size() == 2; }
  int current() const { return current_; }
  int64_t version() const { return versions_[static_cast<size_t>(current_)]; }

  void pull() {
    settle();
    versions_[static_cast<size_t>(current_)] =
        servers_.pull(replicas_[static_cast<size_t>(current_)]);
  }

  void pushAndSwap() {
    const size_t mine = static_cast<size_t>(current_);
    if (!overlapped()) {
      versions_[mine] = servers_.pushPull(replicas_[mine], versions_[mine]);
      return;
    }
    const int other = 1 - current_;
    // The other replica computes next: it holds the reply of the exchange in flight, or,
    // when none is (the first step, a return from idling), the values this step used.
    if (!settleInFlight()) {
      copyValues(replicas_[mine], replicas_[static_cast<size_t>(other)]);
      versions_[static_cast<size_t>(other)] = versions_[mine];
      if (lookahead_ > 0.0f) rememberReply(replicas_[mine], versions_[mine]);
    } else if (lookahead_ > 0.0f) {
      lookAhead(replicas_[static_cast<size_t>(other)], versions_[static_cast<size_t>(other)]);
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      inFlight_ = current_;
      done_ = false;
    }
    started_.notify_all();
    current_ = other;
  }

  void settle() {
    if (!overlapped()) return;
    if (settleInFlight()) current_ = inFlightWas_;
  }

 private:
  /// Waits for the exchange in flight, if any, and rethrows its error. Returns whether one
  /// was in flight (its replica in inFlightWas_, which holds the new values).
  bool settleInFlight() {
    std::unique_lock<std::mutex> lock(mutex_);
    inFlightWas_ = inFlight_;
    if (inFlight_ < 0) return false;
    finished_.wait(lock, [this] { return done_; });
    inFlight_ = -1;
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
    return true;
  }

  /// The exchange thread: pushes the gradients of the replica handed to it and receives the
  /// values to go on with into it.
  void runExchanges() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      started_.wait(lock, [this] { return stopping_ || (inFlight_ >= 0 && !done_); });
      if (stopping_) return;
      const size_t replica = static_cast<size_t>(inFlight_);
      lock.unlock();
      std::exception_ptr error;
      try {
        versions_[replica] = servers_.pushPull(replicas_[replica], versions_[replica]);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      finished_.notify_all();
    }
  }

  /// Keeps the values of `replica` (a reply of the servers at `version`) as the newest reply.
  void rememberReply(const NamedTensors& replica, int64_t version) {
    lastReply_.clear();
    for (const auto& [name, p] : replica) {
      Tensor values = p;
      const float* v = values.data<float>();
      lastReply_.insert(lastReply_.end(), v, v + values.numel());
    }
    lastReplyVersion_ = version;
  }

  /// `replica` holds a new reply (version `version`): moves it on along the change since the
  /// previous reply, to where the servers' values will likely be when this step's gradient
  /// lands (computing at a look-ahead point, as DANA does for delayed gradients), and keeps
  /// the reply itself as the newest.
  void lookAhead(const NamedTensors& replica, int64_t version) {
    if (version <= lastReplyVersion_) return;  // nothing new since the previous reply
    size_t at = 0;
    for (const auto& [name, p] : replica) {
      Tensor values = p;
      float* v = values.data<float>();
      const int64_t n = values.numel();
      for (int64_t j = 0; j < n; ++j, ++at) {
        const float reply = v[j];
        v[j] = reply + lookahead_ * (reply - lastReply_[at]);
        lastReply_[at] = reply;
      }
    }
    lastReplyVersion_ = version;
  }

  static void copyValues(const NamedTensors& from, const NamedTensors& to) {
    for (size_t i = 0; i < from.size(); ++i) {
      Tensor target = to[i].second;
      target.copyFrom(from[i].second);
    }
  }

  ServerGroup& servers_;
  std::vector<NamedTensors> replicas_;
  // Each replica's version; the in-flight replica's is written by the exchange thread and
  // read by the worker only after the exchange is done (the mutex orders the two).
  std::vector<int64_t> versions_;
  // Look-ahead (0: off): how far along the change between the two newest replies a step
  // computes; the newest reply's own values and version.
  float lookahead_ = 0.0f;
  std::vector<float> lastReply_;
  int64_t lastReplyVersion_ = -1;
  int current_ = 0;
  int inFlightWas_ = -1;  // the replica settleInFlight() waited for (-1: none)
  std::mutex mutex_;
  std::condition_variable started_;   // a job was handed to the thread, or it should stop
  std::condition_variable finished_;  // the job in flight is done
  int inFlight_ = -1;                 // the replica whose exchange was handed out (-1: none)
  bool done_ = true;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

WorkerExchange::WorkerExchange(ServerGroup& servers, std::vector<NamedTensors> replicas,
                               double lookahead)
    : impl_(std::make_unique<Impl>(servers, std::move(replicas), lookahead)) {}
WorkerExchange::~WorkerExchange() = default;
bool WorkerExchange::overlapped() const { return impl_->overlapped(); }
int WorkerExchange::current() const { return impl_->current(); }
int64_t WorkerExchange::version() const { return impl_->version(); }
void WorkerExchange::pull() { impl_->pull(); }
void WorkerExchange::pushAndSwap() { impl_->pushAndSwap(); }
void WorkerExchange::settle() { impl_->settle(); }

}  // namespace kolo::parallel::ps
