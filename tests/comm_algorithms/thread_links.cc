// Thread-backed Links test double: per-pair message queues matched by ticket order.
#include "comm_algorithms/thread_links.h"

#include <cstring>
#include <exception>
#include <thread>

#include "kolo/error.h"

namespace kolo::comm::testing {

struct Fabric::Message {
  std::vector<char> data;
  bool consumed = false;
};

struct Fabric::Channel {
  std::mutex mu;
  std::condition_variable cv;
  uint64_t sent = 0;     // sequence number of the next message sent
  uint64_t tickets = 0;  // sequence number the next posted receive will take
  std::map<uint64_t, std::shared_ptr<Message>> queue;
};

namespace {

using Clock = std::chrono::steady_clock;

class SendWork : public Work {
 public:
  SendWork(Fabric& fabric, Fabric::Channel* channel, std::shared_ptr<Fabric::Message> msg, int src, int dst)
      : fabric_(fabric), channel_(channel), msg_(std::move(msg)), src_(src), dst_(dst) {}
  void wait(std::chrono::milliseconds) override {
    if (channel_ == nullptr) return;  // buffered: complete at once
    std::unique_lock lock(channel_->mu);
    const auto until = Clock::now() + fabric_.deadline();
    std::string why;
    while (!msg_->consumed) {
      if (fabric_.poisoned(&why)) KOLO_THROW(IoError, "send ", src_, "->", dst_, " aborted: ", why);
      if (channel_->cv.wait_until(lock, until) == std::cv_status::timeout && !msg_->consumed)
        KOLO_THROW(Timeout, "send ", src_, "->", dst_, " of ", msg_->data.size(), " bytes never received");
    }
  }
  bool test() override {
    if (channel_ == nullptr) return true;
    std::lock_guard lock(channel_->mu);
    return msg_->consumed;
  }

 private:
  Fabric& fabric_;
  Fabric::Channel* channel_;
  std::shared_ptr<Fabric::Message> msg_;
  int src_, dst_;
};

class RecvWork : public Work {
 public:
  RecvWork(Fabric& fabric, Fabric::Channel& channel, uint64_t ticket, void* data, size_t bytes, int src, int dst)
      : fabric_(fabric), channel_(channel), ticket_(ticket), data_(data), bytes_(bytes), src_(src), dst_(dst) {}
  void wait(std::chrono::milliseconds) override {
    if (done_) return;
    std::unique_lock lock(channel_.mu);
    const auto until = Clock::now() + fabric_.deadline();
    std::string why;
    while (channel_.queue.count(ticket_) == 0) {
      if (fabric_.poisoned(&why)) KOLO_THROW(IoError, "recv ", src_, "->", dst_, " aborted: ", why);
      if (channel_.cv.wait_until(lock, until) == std::cv_status::timeout && channel_.queue.count(ticket_) == 0)
        KOLO_THROW(Timeout, "recv ", src_, "->", dst_, " message #", ticket_, " (", bytes_, " bytes) never arrived");
    }
    take();
    lock.unlock();
    channel_.cv.notify_all();
  }
  bool test() override {
    if (done_) return true;
    {
      std::lock_guard lock(channel_.mu);
      if (channel_.queue.count(ticket_) == 0) return false;
      take();
    }
    channel_.cv.notify_all();
    return true;
  }

 private:
  void take() {  // under channel_.mu
    auto it = channel_.queue.find(ticket_);
    std::shared_ptr<Fabric::Message> msg = it->second;
    channel_.queue.erase(it);
    msg->consumed = true;
    done_ = true;
    if (msg->data.size() != bytes_)
      KOLO_THROW(Mismatch, "recv ", src_, "->", dst_, " message #", ticket_, ": expected ", bytes_, " bytes, got ",
                 msg->data.size());
    if (bytes_ > 0) std::memcpy(data_, msg->data.data(), bytes_);
  }
  Fabric& fabric_;
  Fabric::Channel& channel_;
  uint64_t ticket_;
  void* data_;
  size_t bytes_;
  int src_, dst_;
  bool done_ = false;
};

class ThreadLinks : public detail::Links {
 public:
  ThreadLinks(Fabric& fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return fabric_.size(); }
  bool sameHost(int peer) const override { return fabric_.sameHost(rank_, peer); }
  void send(int peer, const void* data, size_t bytes) override { isend(peer, data, bytes)->wait(); }
  void recv(int peer, void* data, size_t bytes) override { irecv(peer, data, bytes)->wait(); }
  std::unique_ptr<Work> isend(int peer, const void* data, size_t bytes) override {
    check(peer);
    KOLO_CHECK_NE(peer, rank_, "send to self");
    auto msg = std::make_shared<Fabric::Message>();
    msg->data.assign(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
    Fabric::Channel& ch = fabric_.channel(rank_, peer);
    {
      std::lock_guard lock(ch.mu);
      ch.queue.emplace(ch.sent++, msg);
    }
    ch.cv.notify_all();
    const bool rendezvous = fabric_.mode() == SendMode::Rendezvous;
    return std::make_unique<SendWork>(fabric_, rendezvous ? &ch : nullptr, std::move(msg), rank_, peer);
  }
  std::unique_ptr<Work> irecv(int peer, void* data, size_t bytes) override {
    check(peer);
    KOLO_CHECK_NE(peer, rank_, "recv from self");
    Fabric::Channel& ch = fabric_.channel(peer, rank_);
    uint64_t ticket;
    {
      std::lock_guard lock(ch.mu);
      ticket = ch.tickets++;
    }
    return std::make_unique<RecvWork>(fabric_, ch, ticket, data, bytes, peer, rank_);
  }

 private:
  void check(int peer) const {
    if (peer < 0 || peer >= fabric_.size())
      KOLO_THROW(InvalidArgument, "rank ", rank_, ": peer ", peer, " outside group of ", fabric_.size());
  }
  Fabric& fabric_;
  int rank_;
};

}  // namespace

Fabric::Fabric(int size, SendMode mode, std::chrono::milliseconds deadline, std::vector<int> hostOf)
    : size_(size), mode_(mode), deadline_(deadline), hostOf_(std::move(hostOf)) {
  channels_.reserve(static_cast<size_t>(size) * size);
  for (int i = 0; i < size * size; ++i) channels_.push_back(std::make_unique<Channel>());
}

Fabric::~Fabric() = default;

std::unique_ptr<detail::Links> Fabric::links(int rank) { return std::make_unique<ThreadLinks>(*this, rank); }

void Fabric::poison(const std::string& why) {
  {
    std::lock_guard lock(poisonMu_);
    if (poison_.empty()) poison_ = why.empty() ? "poisoned" : why;
  }
  for (auto& ch : channels_) {
    std::lock_guard lock(ch->mu);  // pairs with waiters' predicate checks
    ch->cv.notify_all();
  }
}

bool Fabric::poisoned(std::string* why) const {
  std::lock_guard lock(poisonMu_);
  if (poison_.empty()) return false;
  *why = poison_;
  return true;
}

size_t Fabric::undelivered() const {
  size_t total = 0;
  for (const auto& ch : channels_) {
    std::lock_guard lock(ch->mu);
    total += ch->queue.size();
  }
  return total;
}

void runThreads(int size, const std::vector<Fabric*>& fabrics, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        for (Fabric* f : fabrics) f->poison("rank " + std::to_string(r) + " failed: " + e.what());
      }
    });
  }
  for (auto& t : threads) t.join();
  // Report the root cause: the first rank that failed with something other than the abort.
  for (auto& e : errors) {
    if (!e) continue;
    try {
      std::rethrow_exception(e);
    } catch (const IoError&) {
      continue;
    } catch (...) {
      throw;
    }
  }
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

void runRanks(int size, SendMode mode, const std::function<void(detail::Links&, int)>& fn, std::vector<int> hostOf) {
  Fabric fabric(size, mode, std::chrono::seconds(20), std::move(hostOf));
  runThreads(size, {&fabric}, [&](int r) {
    auto links = fabric.links(r);
    fn(*links, r);
  });
  if (fabric.undelivered() != 0)
    KOLO_THROW(Error, fabric.undelivered(), " messages were sent but never received");
}

}  // namespace kolo::comm::testing
