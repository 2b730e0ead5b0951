// HostStoreUplink (host_store_uplink.h): a batch thread that serves each batch of a host's
// requests with a handful of requests to the root, a watcher thread that waits at the root
// for the keys the host's ranks still miss, and barrier threads that each carry one
// batch's arrivals at one barrier. Replies go back to the host store's event loop.
#include "comm/store/host_store_uplink.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "comm/token.h"
#include "kolo/error.h"

namespace kolo::comm::detail {

using Clock = std::chrono::steady_clock;

namespace {

/// The longest single watch at the root; the watch is renewed after it (deadlines of the
/// ranks' reads are enforced here, not by the watch).
constexpr Millis kLongestWatch{30'000};

WireWriter& status(WireWriter& out, StoreStatus s) { return out.u8(static_cast<uint8_t>(s)); }

Bytes okFrame() {
  WireWriter out;
  return status(out, StoreStatus::Ok).finish();
}

Bytes counterFrame(int64_t value) {
  WireWriter out;
  return status(out, StoreStatus::Ok).u64(static_cast<uint64_t>(value)).finish();
}

Bytes errorFrame(const std::string& message) {
  WireWriter out;
  return status(out, StoreStatus::Error).str(message).finish();
}

Bytes timeoutFrame(const std::vector<std::string>& missing) {
  WireWriter out;
  status(out, StoreStatus::Timeout).u32(static_cast<uint32_t>(missing.size()));
  for (const auto& key : missing) out.str(key);
  return out.finish();
}

Millis remaining(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<Millis>(deadline - Clock::now());
  return std::max(left, Millis(0));
}

struct Reply {
  uint64_t connection;
  uint64_t serial;
  Bytes frame;
};

}  // namespace

class HostStoreUplink::Impl {
 public:
  Impl(const TcpStoreClientOptions& root, DeliverReply deliver)
      : root_(root), deliver_(std::move(deliver)) {
    control_ = std::make_unique<TcpStoreClient>(root_);
    watcher_ = std::make_unique<TcpStoreClient>(root_);
    wakePrefix_ = "kolo-host-store/" + randomToken(8) + "/wake/";
    batches_ = std::thread([this] { batchLoop(); });
    watch_ = std::thread([this] { watchLoop(); });
  }

  ~Impl() { stop(); }

  void submit(ForwardedRequest request) {
    {
      std::lock_guard lock(mutex_);
      if (!failed_ && !stopping_) {
        incoming_.push_back(std::move(request));
        changed_.notify_all();
        return;
      }
    }
    deliver_(request.connection, request.serial, {});
  }

  void stop() {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
      stopping_ = true;
      // Requests to the root in progress end now (they fail with IoError, which the
      // threads take for the end).
      control_->interrupt();
      watcher_->interrupt();
      for (TcpStoreClient* client : barrierClients_) client->interrupt();
    }
    changed_.notify_all();
    if (batches_.joinable()) batches_.join();
    if (watch_.joinable()) watch_.join();
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mutex_);
      workers.swap(barrierWorkers_);
    }
    for (std::thread& worker : workers) worker.join();
  }

 private:
  /// A get, wait or multi-get whose keys are not all at the root yet.
  struct WaitingRead {
    ForwardedRequest forwarded;
    std::vector<Bytes> values;  // by position in the request's keys
    std::vector<bool> got;
    size_t missing = 0;
  };
  struct Want {
    uint64_t read;
    size_t position;
  };
  /// A barrier whose first arrivals wait at the root; the arrivals of later batches are
  /// counted with an add and wait here until those first ones are answered.
  struct OpenBarrier {
    struct Attached {
      ForwardedRequest request;
      int64_t arrival = 0;
      bool counted = false;  // its add was answered: `arrival` holds its number
      bool answered = false;
    };
    std::vector<Attached> attached;
    bool done = false;
    StoreStatus outcome = StoreStatus::Ok;
    std::string message;  // outcome Error
  };
  /// One batch's arrivals at one barrier (one key, one target).
  struct BarrierJob {
    std::string key;
    int64_t target = 0;
    std::vector<ForwardedRequest> requests;
    Clock::time_point deadline = Clock::time_point::max();
    std::shared_ptr<OpenBarrier> open;
  };

  std::string wakeKey(uint64_t generation) const {
    return wakePrefix_ + std::to_string(generation);
  }

  void deliverAll(std::vector<Reply>& replies) {
    for (Reply& reply : replies) deliver_(reply.connection, reply.serial, std::move(reply.frame));
    replies.clear();
  }

  /// The root is lost (or the uplink stops): every request not answered yet is answered by
  /// closing its connection; requests of `batch` that were answered already are ignored by
  /// the event loop (their serial has moved on).
  void fail(const std::vector<ForwardedRequest>& batch) {
    std::vector<Reply> closes;
    for (const ForwardedRequest& r : batch) closes.push_back({r.connection, r.serial, {}});
    {
      std::lock_guard lock(mutex_);
      failed_ = true;
      for (const ForwardedRequest& r : incoming_) closes.push_back({r.connection, r.serial, {}});
      incoming_.clear();
      for (const auto& [id, read] : reads_)
        closes.push_back({read.forwarded.connection, read.forwarded.serial, {}});
      reads_.clear();
      wanted_.clear();
      for (const BarrierJob& job : barrierJobs_)
        for (const ForwardedRequest& r : job.requests)
          closes.push_back({r.connection, r.serial, {}});
      barrierJobs_.clear();
    }
    changed_.notify_all();
    deliverAll(closes);
  }

  // ---- batches ----

  void batchLoop() {
    for (;;) {
      std::vector<ForwardedRequest> batch;
      std::vector<Reply> replies;
      {
        std::unique_lock lock(mutex_);
        changed_.wait_until(lock, nextReadDeadline(), [&] {
          return stopping_ || failed_ || !incoming_.empty() || !appeared_.empty() ||
                 nextReadDeadline() <= Clock::now();
        });
        if (stopping_ || failed_) return;
        batch.swap(incoming_);
        if (!appeared_.empty()) {
          for (auto& [key, value] : appeared_) resolve(key, value, replies);
          appeared_.clear();
          changed_.notify_all();  // the watcher renews its watch once these are taken
        }
        expireReads(replies);
      }
      deliverAll(replies);
      if (batch.empty()) continue;
      try {
        serve(batch);
      } catch (const Error&) {
        fail(batch);
        return;
      }
    }
  }

  /// Serves one batch (see the protocol in host_store_uplink.h). Throws what the root's
  /// client throws when the root is lost; a refusal of one request (an add to a key that is
  /// not a counter) is that request's Error reply.
  void serve(std::vector<ForwardedRequest>& batch) {
    std::vector<Reply> replies;
    std::vector<std::string> setKeys;
    std::vector<Bytes> setValues;
    std::vector<const ForwardedRequest*> setters, singles, checks, reads;
    std::vector<std::string> addOrder;
    std::unordered_map<std::string, std::vector<const ForwardedRequest*>> adds;
    std::map<std::pair<std::string, int64_t>, BarrierJob> barriers;
    for (ForwardedRequest& f : batch) {
      StoreRequest& r = f.request;
      switch (r.op) {
        case StoreOp::Set:
          setKeys.push_back(r.keys[0]);
          setValues.push_back(std::move(r.value));
          setters.push_back(&f);
          break;
        case StoreOp::MultiSet:
          for (size_t i = 0; i < r.keys.size(); ++i) {
            setKeys.push_back(r.keys[i]);
            setValues.push_back(std::move(r.values[i]));
          }
          setters.push_back(&f);
          break;
        case StoreOp::Add: {
          auto& list = adds[r.keys[0]];
          if (list.empty()) addOrder.push_back(r.keys[0]);
          list.push_back(&f);
          break;
        }
        case StoreOp::Check:
        case StoreOp::CheckEach:
          checks.push_back(&f);
          break;
        case StoreOp::Get:
        case StoreOp::Wait:
        case StoreOp::MultiGet:
          reads.push_back(&f);
          break;
        case StoreOp::Arrive: {
          BarrierJob& job = barriers[{r.keys[0], r.delta}];
          job.key = r.keys[0];
          job.target = r.delta;
          job.deadline = std::min(job.deadline, f.deadline);
          job.requests.push_back(f);
          break;
        }
        default:  // compare-and-set, remove, get-available: one request each
          singles.push_back(&f);
          break;
      }
    }
    if (!setKeys.empty()) {
      control_->multiSet(setKeys, setValues);
      for (const ForwardedRequest* f : setters)
        replies.push_back({f->connection, f->serial, okFrame()});
    }
    for (const ForwardedRequest* f : singles)
      replies.push_back({f->connection, f->serial, serveSingle(f->request)});
    for (const std::string& key : addOrder) serveAdds(key, adds[key], replies);
    if (!checks.empty()) serveChecks(checks, replies);
    deliverAll(replies);
    if (!reads.empty()) serveReads(reads, replies);
    deliverAll(replies);
    for (auto& [id, job] : barriers) serveArrivals(std::move(job));
  }

  /// The first arrivals at a barrier go to the root as one arrival counting them all, on a
  /// barrier connection; while they wait there, later arrivals are counted with one add on
  /// this connection and answered when the first ones are.
  void serveArrivals(BarrierJob job) {
    std::shared_ptr<OpenBarrier> open;
    size_t first = 0;
    {
      std::lock_guard lock(mutex_);
      auto it = openBarriers_.find({job.key, job.target});
      if (it == openBarriers_.end()) {
        job.open = std::make_shared<OpenBarrier>();
        openBarriers_.emplace(std::make_pair(job.key, job.target), job.open);
      } else {
        // Registered before the add is sent: the barrier cannot open before these
        // arrivals count, so the first ones cannot be answered before they are attached.
        open = it->second;
        first = open->attached.size();
        for (ForwardedRequest& r : job.requests) open->attached.push_back({std::move(r)});
      }
    }
    if (!open) {
      dispatchBarrier(std::move(job));
      return;
    }
    const auto n = static_cast<int64_t>(job.requests.size());
    std::vector<Reply> replies;
    int64_t after = 0;
    std::string refused;
    try {
      after = control_->add(job.key, n);
    } catch (const InvalidArgument& e) {
      refused = e.what();
    }
    {
      std::lock_guard lock(mutex_);
      for (size_t i = first; i < first + static_cast<size_t>(n); ++i) {
        auto& a = open->attached[i];
        a.counted = true;
        a.arrival = after - n + 1 + static_cast<int64_t>(i - first);
        if (!refused.empty()) {
          a.answered = true;
          replies.push_back({a.request.connection, a.request.serial, errorFrame(refused)});
        } else if (open->done) {
          a.answered = true;
          replies.push_back(barrierReply(*open, a, job.key));
        }
      }
    }
    deliverAll(replies);
  }

  static Reply barrierReply(const OpenBarrier& open, const OpenBarrier::Attached& a,
                            const std::string& key) {
    Bytes frame = open.outcome == StoreStatus::Ok        ? counterFrame(a.arrival)
                  : open.outcome == StoreStatus::Timeout ? timeoutFrame({key})
                                                         : errorFrame(open.message);
    return {a.request.connection, a.request.serial, std::move(frame)};
  }

  /// The first arrivals at `job`'s barrier were answered with `outcome`: so are the
  /// arrivals attached to them whose add has been answered (the others when it is).
  void closeBarrier(const BarrierJob& job, StoreStatus outcome, const std::string& message,
                    std::vector<Reply>& replies) {
    std::lock_guard lock(mutex_);
    OpenBarrier& open = *job.open;
    open.done = true;
    open.outcome = outcome;
    open.message = message;
    auto it = openBarriers_.find({job.key, job.target});
    if (it != openBarriers_.end() && it->second == job.open) openBarriers_.erase(it);
    for (auto& a : open.attached) {
      if (!a.counted || a.answered) continue;
      a.answered = true;
      replies.push_back(barrierReply(open, a, job.key));
    }
  }

  Bytes serveSingle(const StoreRequest& r) {
    try {
      WireWriter out;
      switch (r.op) {
        case StoreOp::CompareSet:
          return status(out, StoreStatus::Ok)
              .bytes(control_->compareSet(r.keys[0], r.expected, r.value))
              .finish();
        case StoreOp::Remove:
          return status(out, StoreStatus::Ok).u8(control_->remove(r.keys[0]) ? 1 : 0).finish();
        default: {
          // A get-available from a rank is answered with what exists now: the watch is this
          // host store's own.
          const auto found = control_->getAvailable(r.keys, Millis(0));
          status(out, StoreStatus::Ok).u32(static_cast<uint32_t>(found.size()));
          for (const auto& value : found) {
            out.u8(value ? 1 : 0);
            if (value) out.bytes(*value);
          }
          return out.finish();
        }
      }
    } catch (const InvalidArgument& e) {
      return errorFrame(e.what());
    }
  }

  /// The adds to one key as one add of their sum; each is answered with the counter as it
  /// would stand after its own delta, had they arrived in this order.
  void serveAdds(const std::string& key, const std::vector<const ForwardedRequest*>& list,
                 std::vector<Reply>& replies) {
    int64_t sum = 0;
    bool fits = true;
    for (const ForwardedRequest* f : list)
      fits = fits && !__builtin_add_overflow(sum, f->request.delta, &sum);
    if (!fits || list.size() == 1) {
      for (const ForwardedRequest* f : list) {
        try {
          replies.push_back(
              {f->connection, f->serial, counterFrame(control_->add(key, f->request.delta))});
        } catch (const InvalidArgument& e) {
          replies.push_back({f->connection, f->serial, errorFrame(e.what())});
        }
      }
      return;
    }
    int64_t after = 0;
    try {
      after = control_->add(key, sum);
    } catch (const InvalidArgument& e) {
      for (const ForwardedRequest* f : list)
        replies.push_back({f->connection, f->serial, errorFrame(e.what())});
      return;
    }
    int64_t running = after - sum;
    for (const ForwardedRequest* f : list) {
      running += f->request.delta;
      replies.push_back({f->connection, f->serial, counterFrame(running)});
    }
  }

  void serveChecks(const std::vector<const ForwardedRequest*>& checks,
                   std::vector<Reply>& replies) {
    std::vector<std::string> keys;
    std::unordered_map<std::string, size_t> index;
    for (const ForwardedRequest* f : checks)
      for (const auto& key : f->request.keys)
        if (index.emplace(key, keys.size()).second) keys.push_back(key);
    const std::vector<bool> present =
        keys.empty() ? std::vector<bool>{} : control_->checkEach(keys);
    for (const ForwardedRequest* f : checks) {
      WireWriter out;
      status(out, StoreStatus::Ok);
      if (f->request.op == StoreOp::Check) {
        bool all = true;
        for (const auto& key : f->request.keys) all = all && present[index[key]];
        out.u8(all ? 1 : 0);
      } else {
        out.u32(static_cast<uint32_t>(f->request.keys.size()));
        for (const auto& key : f->request.keys) out.u8(present[index[key]] ? 1 : 0);
      }
      replies.push_back({f->connection, f->serial, out.finish()});
    }
  }

  /// One get-available without waiting over the union of the reads' keys; the complete
  /// reads are answered, the others wait here for the watcher.
  void serveReads(const std::vector<const ForwardedRequest*>& reads, std::vector<Reply>& replies) {
    std::vector<std::string> keys;
    std::unordered_map<std::string, size_t> index;
    for (const ForwardedRequest* f : reads)
      for (const auto& key : f->request.keys)
        if (index.emplace(key, keys.size()).second) keys.push_back(key);
    const auto found = control_->getAvailable(keys, Millis(0));
    std::optional<std::string> wake;
    {
      std::lock_guard lock(mutex_);
      bool newKeys = false;
      for (const ForwardedRequest* f : reads) {
        WaitingRead read;
        read.forwarded = *f;
        const auto& readKeys = f->request.keys;
        read.values.resize(readKeys.size());
        read.got.assign(readKeys.size(), false);
        for (size_t i = 0; i < readKeys.size(); ++i) {
          const auto& value = found[index[readKeys[i]]];
          if (value) {
            read.values[i] = *value;
            read.got[i] = true;
          } else {
            ++read.missing;
          }
        }
        if (read.missing == 0) {
          replies.push_back({f->connection, f->serial, readReply(read)});
          continue;
        }
        const uint64_t id = ++lastRead_;
        for (size_t i = 0; i < readKeys.size(); ++i) {
          if (read.got[i]) continue;
          auto& wants = wanted_[readKeys[i]];
          newKeys = newKeys || wants.empty();
          wants.push_back({id, i});
        }
        reads_.emplace(id, std::move(read));
      }
      // The watcher waits at the root on the keys it saw; new ones need a new watch: wake
      // it by setting the key it also watches.
      if (newKeys && watching_ && !woken_) {
        woken_ = true;
        wake = wakeKey(wakeGeneration_);
      }
    }
    changed_.notify_all();
    if (wake) control_->set(*wake, Bytes{});
  }

  static Bytes readReply(const WaitingRead& read) {
    WireWriter out;
    status(out, StoreStatus::Ok);
    if (read.forwarded.request.op == StoreOp::Get) out.bytes(read.values[0]);
    if (read.forwarded.request.op == StoreOp::MultiGet) {
      out.u32(static_cast<uint32_t>(read.values.size()));
      for (const Bytes& value : read.values) out.bytes(value);
    }
    return out.finish();
  }

  /// A key the watcher found at the root: the reads waiting for it take its value. Under mutex_.
  void resolve(const std::string& key, const Bytes& value, std::vector<Reply>& replies) {
    auto it = wanted_.find(key);
    if (it == wanted_.end()) return;
    const std::vector<Want> wants = std::move(it->second);
    wanted_.erase(it);
    for (const Want& want : wants) {
      auto r = reads_.find(want.read);
      if (r == reads_.end() || r->second.got[want.position]) continue;
      WaitingRead& read = r->second;
      read.values[want.position] = value;
      read.got[want.position] = true;
      if (--read.missing > 0) continue;
      replies.push_back({read.forwarded.connection, read.forwarded.serial, readReply(read)});
      reads_.erase(r);
    }
  }

  /// Under mutex_.
  Clock::time_point nextReadDeadline() const {
    Clock::time_point next = Clock::now() + kLongestWatch;
    for (const auto& [id, read] : reads_) next = std::min(next, read.forwarded.deadline);
    return next;
  }

  /// Answers Timeout, naming the keys still missing, to the reads past their deadline. Under
  /// mutex_.
  void expireReads(std::vector<Reply>& replies) {
    const auto now = Clock::now();
    for (auto it = reads_.begin(); it != reads_.end();) {
      const WaitingRead& read = it->second;
      if (read.forwarded.deadline > now) {
        ++it;
        continue;
      }
      std::vector<std::string> missing;
      for (size_t i = 0; i < read.got.size(); ++i) {
        if (read.got[i]) continue;
        const std::string& key = read.forwarded.request.keys[i];
        missing.push_back(key);
        auto wants = wanted_.find(key);
        if (wants == wanted_.end()) continue;
        std::erase_if(wants->second, [&](const Want& w) { return w.read == it->first; });
        if (wants->second.empty()) wanted_.erase(wants);
      }
      replies.push_back({read.forwarded.connection, read.forwarded.serial, timeoutFrame(missing)});
      it = reads_.erase(it);
    }
  }

  // ---- the watcher ----

  void watchLoop() {
    for (;;) {
      std::vector<std::string> keys;
      Clock::time_point until;
      uint64_t generation = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(
            lock, [&] { return stopping_ || failed_ || (!wanted_.empty() && appeared_.empty()); });
        if (stopping_ || failed_) return;
        keys.reserve(wanted_.size() + 1);
        for (const auto& [key, wants] : wanted_) keys.push_back(key);
        generation = wakeGeneration_;
        keys.push_back(wakeKey(generation));
        until = nextReadDeadline();
        watching_ = true;
        woken_ = false;
      }
      std::vector<std::optional<Bytes>> found;
      try {
        found = watcher_->getAvailable(keys, remaining(until));
      } catch (const Error&) {
        fail({});
        return;
      }
      const bool woken = found.back().has_value();
      {
        std::lock_guard lock(mutex_);
        watching_ = false;
        for (size_t i = 0; i + 1 < keys.size(); ++i)
          if (found[i]) appeared_.emplace_back(std::move(keys[i]), std::move(*found[i]));
        if (woken) ++wakeGeneration_;
      }
      changed_.notify_all();
      if (!woken) continue;
      try {
        watcher_->remove(wakeKey(generation));
      } catch (const Error&) {
        fail({});
        return;
      }
    }
  }

  // ---- barriers ----

  void dispatchBarrier(BarrierJob job) {
    std::lock_guard lock(mutex_);
    barrierJobs_.push_back(std::move(job));
    if (idleBarrierWorkers_ == 0 && !stopping_)
      barrierWorkers_.emplace_back([this] { barrierLoop(); });
    changed_.notify_all();
  }

  /// Carries one job's arrivals at a time on a connection of its own.
  void barrierLoop() {
    std::unique_ptr<TcpStoreClient> client;
    for (;;) {
      BarrierJob job;
      {
        std::unique_lock lock(mutex_);
        ++idleBarrierWorkers_;
        changed_.wait(lock, [&] { return stopping_ || failed_ || !barrierJobs_.empty(); });
        --idleBarrierWorkers_;
        if (stopping_ || failed_) break;
        job = std::move(barrierJobs_.front());
        barrierJobs_.pop_front();
      }
      std::vector<Reply> replies;
      const auto n = static_cast<int64_t>(job.requests.size());
      try {
        if (!client) {
          client = std::make_unique<TcpStoreClient>(root_);
          std::lock_guard lock(mutex_);
          barrierClients_.push_back(client.get());
          if (stopping_) client->interrupt();
        }
        const int64_t after = client->arriveMany(job.key, job.target, n, remaining(job.deadline));
        for (int64_t i = 0; i < n; ++i) {
          const ForwardedRequest& r = job.requests[static_cast<size_t>(i)];
          replies.push_back({r.connection, r.serial, counterFrame(after - n + 1 + i)});
        }
        closeBarrier(job, StoreStatus::Ok, "", replies);
      } catch (const Timeout&) {
        for (const ForwardedRequest& r : job.requests)
          replies.push_back({r.connection, r.serial, timeoutFrame({job.key})});
        closeBarrier(job, StoreStatus::Timeout, "", replies);
      } catch (const InvalidArgument& e) {
        for (const ForwardedRequest& r : job.requests)
          replies.push_back({r.connection, r.serial, errorFrame(e.what())});
        closeBarrier(job, StoreStatus::Error, e.what(), replies);
      } catch (const Error&) {
        std::vector<ForwardedRequest> lost = job.requests;
        {
          std::lock_guard lock(mutex_);
          for (const auto& a : job.open->attached) lost.push_back(a.request);
        }
        fail(lost);
        break;
      }
      deliverAll(replies);
    }
    std::lock_guard lock(mutex_);
    std::erase(barrierClients_, client.get());
  }

  TcpStoreClientOptions root_;
  DeliverReply deliver_;
  std::unique_ptr<TcpStoreClient> control_;
  std::unique_ptr<TcpStoreClient> watcher_;
  std::string wakePrefix_;

  std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool failed_ = false;
  std::vector<ForwardedRequest> incoming_;
  /// Reads waiting for keys, by id, and the keys they wait for.
  std::unordered_map<uint64_t, WaitingRead> reads_;
  std::unordered_map<std::string, std::vector<Want>> wanted_;
  uint64_t lastRead_ = 0;
  /// What the watcher found, for the batch thread to hand to the reads.
  std::vector<std::pair<std::string, Bytes>> appeared_;
  bool watching_ = false;  // a watch is at the root
  bool woken_ = false;     // its wake key was set
  uint64_t wakeGeneration_ = 0;
  std::deque<BarrierJob> barrierJobs_;
  /// Barriers whose first arrivals wait at the root, by key and target.
  std::map<std::pair<std::string, int64_t>, std::shared_ptr<OpenBarrier>> openBarriers_;
  int idleBarrierWorkers_ = 0;
  std::vector<std::thread> barrierWorkers_;
  std::vector<TcpStoreClient*> barrierClients_;

  std::thread batches_;
  std::thread watch_;
};

HostStoreUplink::HostStoreUplink(const TcpStoreClientOptions& root, DeliverReply deliver)
    : impl_(std::make_unique<Impl>(root, std::move(deliver))) {}
HostStoreUplink::~HostStoreUplink() = default;
void HostStoreUplink::submit(ForwardedRequest request) { impl_->submit(std::move(request)); }
void HostStoreUplink::stop() { impl_->stop(); }

}  // namespace kolo::comm::detail
