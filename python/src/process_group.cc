// ProcessGroupKolo's machinery: the Work and its future, rendezvous through torch's store,
// the worker and transfer threads, and the reductions kolo has no kernel for.
#include "process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <stdexcept>

namespace kolo_torch {
namespace {

/// kolo's RendezvousStore over torch's c10d::Store (the PrefixStore of the group).
class TorchStore : public RendezvousStore {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { store_->set(key, value); }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    store_->wait({key}, timeout);
    return store_->get(key);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    store_->wait(keys, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  bool remove(const std::string& key) override { return store_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return store_->check(keys); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

KoloWork::KoloWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
                   std::shared_ptr<TaskQueue> queue)
    : c10d::Work(rank, type, title), outputs_(std::move(outputs)), queue_(std::move(queue)) {}

bool KoloWork::wait(std::chrono::milliseconds timeout) {
  if (!c10d::Work::isCompleted()) {
    if (timeout == kNoTimeout) {
      queue_->runThrough(this);
    } else {
      queue_->hurry();
    }
  }
  return c10d::Work::wait(timeout);
}

bool KoloWork::isCompleted() {
  if (c10d::Work::isCompleted()) return true;
  queue_->hurry();
  return false;
}

c10::intrusive_ptr<c10::ivalue::Future> KoloWork::getFuture() {
  std::unique_lock<std::mutex> lock(futureMutex_);
  if (future_) return future_;
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
  if (!finished_) {
    lock.unlock();
    queue_->hurry();
    return future_;
  }
  // Finished before anyone asked: nothing can have been chained to this new future yet.
  auto future = future_;
  lock.unlock();
  completeFuture(future, error_);
  return future;
}

c10::intrusive_ptr<c10::ivalue::Future> KoloWork::finishWork(std::exception_ptr error) {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    // One section with getFuture()'s: exactly one of the two completes the future.
    std::lock_guard<std::mutex> lock(futureMutex_);
    finished_ = true;
    error_ = error;
    future = future_;
  }
  finish(error);
  return future;
}

void KoloWork::completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::exception_ptr error) {
  if (error) {
    future->setError(error);
  } else {
    future->markCompleted(c10::IValue(outputs_));
  }
}

ProcessGroupKolo::ProcessGroupKolo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                   std::chrono::milliseconds timeout)
    : c10d::ProcessGroup(rank, size), store_(store) {
  TORCH_CHECK(timeout.count() > 0, "kolo: the process group's timeout must be positive");
  try {
    group_ = createGroup(std::make_shared<TorchStore>(store), rank, size, timeout);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "kolo: rendezvous of rank ", rank, " of ", size, " failed: ", e.what());
  }
  worker_ = std::thread([this] { tasks_->serve(); });
  transferThread_ = std::thread([this] { transferLoop(); });
}

ProcessGroupKolo::~ProcessGroupKolo() {
  // Python drops the last reference with the GIL held, while a completer may be waiting
  // for it to run a future's Python callback: release it while the threads finish.
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release release;
    shutdown();
  } else {
    shutdown();
  }
}

void ProcessGroupKolo::shutdown() {
  // Both threads finish what was issued first: the tensors and the peers expect it. The
  // worker drains its queue (posting transfers) before the transfer thread is told to stop.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  tasks_->stop();
  worker_.join();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    transfersStopping_ = true;
  }
  transferCv_.notify_all();
  transferThread_.join();
  std::vector<std::thread> completers;
  {
    std::lock_guard<std::mutex> lock(completions_->mutex);
    completions_->stopping = true;
    completers.swap(completions_->threads);
  }
  completions_->cv.notify_all();
  for (auto& t : completers) {
    // The group's last reference went in a future's callback on this completer: it ends
    // once the destructor returns, on the queue it holds.
    if (t.get_id() == std::this_thread::get_id())
      t.detach();
    else
      t.join();
  }
}

void ProcessGroupKolo::complete(const c10::intrusive_ptr<KoloWork>& work, std::exception_ptr error) {
  auto future = work->finishWork(error);
  if (!future) return;  // nobody asked for it: getFuture() completes one made later
  Completions& c = *completions_;
  std::lock_guard<std::mutex> lock(c.mutex);
  c.items.push_back(Completion{work, std::move(future), error});
  if (c.idle < c.items.size()) {
    ++c.idle;  // counted idle until it takes its first item
    c.threads.emplace_back([state = completions_] { completerLoop(state); });
  }
  c.cv.notify_one();
}

void ProcessGroupKolo::completerLoop(const std::shared_ptr<Completions>& state) {
  at::NoGradGuard noGrad;
  std::unique_lock<std::mutex> lock(state->mutex);
  for (;;) {
    state->cv.wait(lock, [&] { return state->stopping || !state->items.empty(); });
    if (state->items.empty()) return;
    Completion done = std::move(state->items.front());
    state->items.pop_front();
    --state->idle;
    lock.unlock();
    done.work->completeFuture(done.future, done.error);
    done = Completion{};  // may drop the group's last reference (see Completions)
    lock.lock();
    ++state->idle;
  }
}

c10::intrusive_ptr<c10d::Work> ProcessGroupKolo::enqueue(const char* name, c10d::OpType type,
                                                         std::vector<at::Tensor> outputs,
                                                         std::function<void(KoloWork&)> body, bool transfer) {
  // Names and queue places are given under one lock, so "#N" is the N-th to run.
  std::lock_guard<std::mutex> lock(mutex_);
  TORCH_CHECK(!stopping_, "kolo: ", name, " on a process group that is being destroyed");
  auto work = c10::make_intrusive<KoloWork>(getRank(), type, name, std::move(outputs), tasks_);
  std::string what = std::string(name) + " #" + std::to_string(issued_++);
  // The task may run on a caller's thread: it holds the group's `this`, which outlives it
  // (the destructor waits until the queue has run everything).
  tasks_->push(work.get(), [this, work, what = std::move(what), body = std::move(body), transfer] {
    runTask(work, what, body, transfer);
  });
  return work;
}

void ProcessGroupKolo::postTransfer(KoloWork& work, const std::string& what, std::unique_ptr<Transfer> transfer,
                                    at::Tensor staging, at::Tensor target) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    transfers_.push_back(PendingTransfer{c10::intrusive_ptr<KoloWork>::reclaim_copy(&work), what,
                                         std::move(transfer), std::move(staging), std::move(target)});
  }
  transferCv_.notify_one();
}

std::exception_ptr ProcessGroupKolo::describe(const std::string& what, std::exception_ptr error) const {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return std::make_exception_ptr(std::runtime_error("kolo: " + what + " on rank " + std::to_string(getRank()) +
                                                      " of " + std::to_string(getSize()) + " failed: " + e.what()));
  } catch (...) {
    return error;
  }
}

void ProcessGroupKolo::runTask(const c10::intrusive_ptr<KoloWork>& work, const std::string& what,
                               const std::function<void(KoloWork&)>& body, bool transfer) {
  at::NoGradGuard noGrad;  // in-place copies into tensors that may require grad
  std::exception_ptr error;
  try {
    current_ = &what;
    body(*work);
  } catch (...) {
    error = describe(what, std::current_exception());
  }
  // A point-to-point body hands its Work to the transfer thread, which completes it.
  if (error || !transfer) complete(work, error);
}

void ProcessGroupKolo::transferLoop() {
  at::NoGradGuard noGrad;
  for (;;) {
    PendingTransfer pending;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      transferCv_.wait(lock, [&] { return transfersStopping_ || !transfers_.empty(); });
      if (transfers_.empty()) return;
      pending = std::move(transfers_.front());
      transfers_.pop_front();
    }
    std::exception_ptr error;
    try {
      pending.transfer->wait();
      if (const int from = pending.transfer->source(); from >= 0) pending.work->setSourceRank(from);
      if (pending.target.defined()) pending.target.copy_(pending.staging);
    } catch (...) {
      error = describe(pending.what, std::current_exception());
    }
    complete(pending.work, error);
  }
}

// ---- reductions ----

namespace {

bool isFloating(at::ScalarType t) {
  return t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16;
}

const char* opName(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM: return "SUM";
    case c10d::ReduceOp::AVG: return "AVG";
    case c10d::ReduceOp::PRODUCT: return "PRODUCT";
    case c10d::ReduceOp::MIN: return "MIN";
    case c10d::ReduceOp::MAX: return "MAX";
    case c10d::ReduceOp::BAND: return "BAND";
    case c10d::ReduceOp::BOR: return "BOR";
    case c10d::ReduceOp::BXOR: return "BXOR";
    default: return "an unsupported op";
  }
}

}  // namespace

void checkReduce(const at::Tensor& t, c10d::ReduceOp op, const char* what) {
  const auto kind = op.op_;
  const bool bitwise = kind == c10d::ReduceOp::BAND || kind == c10d::ReduceOp::BOR || kind == c10d::ReduceOp::BXOR;
  TORCH_CHECK(kind == c10d::ReduceOp::SUM || kind == c10d::ReduceOp::AVG || kind == c10d::ReduceOp::PRODUCT ||
                  kind == c10d::ReduceOp::MIN || kind == c10d::ReduceOp::MAX || bitwise,
              "kolo: ", what, " supports SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR and BXOR, not ", opName(kind));
  TORCH_CHECK(!(bitwise && (isFloating(t.scalar_type()) || t.is_complex())), "kolo: ", what, " with ", opName(kind),
              " needs an integer or bool tensor, got ", t.scalar_type());
  TORCH_CHECK(!(kind == c10d::ReduceOp::AVG && !isFloating(t.scalar_type())), "kolo: ", what,
              " with AVG needs a floating-point tensor, got ", t.scalar_type());
}

namespace {

/// kolo's own kernel for (dtype, op), when it has one.
bool nativeReduce(at::ScalarType t, c10d::ReduceOp::RedOpType op, Type& type, Op& kop) {
  if (t == at::kBool) {  // 0/1 bytes: or is max, and is min
    type = Type::U8;
    if (op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::MAX || op == c10d::ReduceOp::BOR) return kop = Op::Max, true;
    if (op == c10d::ReduceOp::PRODUCT || op == c10d::ReduceOp::MIN || op == c10d::ReduceOp::BAND)
      return kop = Op::Min, true;
    return false;
  }
  if (t == at::kChar) {  // two's complement sums and products wrap to the same bits as u8's
    type = Type::U8;
    if (op == c10d::ReduceOp::SUM) return kop = Op::Sum, true;
    if (op == c10d::ReduceOp::PRODUCT) return kop = Op::Prod, true;
    return false;
  }
  switch (t) {
    case at::kFloat: type = Type::F32; break;
    case at::kDouble: type = Type::F64; break;
    case at::kHalf: type = Type::F16; break;
    case at::kBFloat16: type = Type::BF16; break;
    case at::kInt: type = Type::I32; break;
    case at::kLong: type = Type::I64; break;
    case at::kByte: type = Type::U8; break;
    default: return false;
  }
  switch (op) {
    case c10d::ReduceOp::SUM: kop = Op::Sum; return true;
    case c10d::ReduceOp::PRODUCT: kop = Op::Prod; return true;
    case c10d::ReduceOp::MIN: kop = Op::Min; return true;
    case c10d::ReduceOp::MAX: kop = Op::Max; return true;
    case c10d::ReduceOp::AVG: kop = Op::Avg; return isFloating(t);
    default: return false;
  }
}

/// Reduces the rows of `rows` (size, n) in rank order into `out` (n).
void reduceRows(const at::Tensor& rows, c10d::ReduceOp::RedOpType op, at::Tensor& out) {
  at::Tensor acc = rows[0].clone();
  for (int64_t r = 1; r < rows.size(0); ++r) {
    const at::Tensor row = rows[r];
    switch (op) {
      case c10d::ReduceOp::SUM:
        if (acc.scalar_type() == at::kBool) acc.logical_or_(row); else acc.add_(row);
        break;
      case c10d::ReduceOp::AVG: acc.add_(row); break;
      case c10d::ReduceOp::PRODUCT:
        if (acc.scalar_type() == at::kBool) acc.logical_and_(row); else acc.mul_(row);
        break;
      case c10d::ReduceOp::MIN: acc = at::minimum(acc, row); break;
      case c10d::ReduceOp::MAX: acc = at::maximum(acc, row); break;
      case c10d::ReduceOp::BAND: acc.bitwise_and_(row); break;
      case c10d::ReduceOp::BOR: acc.bitwise_or_(row); break;
      case c10d::ReduceOp::BXOR: acc.bitwise_xor_(row); break;
      default: TORCH_CHECK(false, "kolo: cannot reduce with ", opName(op));
    }
  }
  if (op == c10d::ReduceOp::AVG) acc.div_(rows.size(0));
  out.copy_(acc);
}

}  // namespace

void ProcessGroupKolo::allreduceInPlace(at::Tensor& t, c10d::ReduceOp op) {
  Type type;
  Op kop;
  if (nativeReduce(t.scalar_type(), op.op_, type, kop)) {
    group_->allreduce(t.data_ptr(), static_cast<size_t>(t.numel()), type, kop);
    return;
  }
  at::Tensor rows = at::empty({getSize(), t.numel()}, t.options());
  group_->allgather(t.data_ptr(), rows.data_ptr(), t.nbytes());
  at::Tensor flat = t.view({-1});
  reduceRows(rows, op.op_, flat);
}

void ProcessGroupKolo::reduceInPlace(at::Tensor& t, c10d::ReduceOp op, int root) {
  Type type;
  Op kop;
  if (nativeReduce(t.scalar_type(), op.op_, type, kop)) {
    group_->reduce(t.data_ptr(), static_cast<size_t>(t.numel()), type, kop, root);
    return;
  }
  allreduceInPlace(t, op);  // every rank gets the result; only the root's is promised
}

void ProcessGroupKolo::reduceScatterFlat(const at::Tensor& flat, at::Tensor& out, c10d::ReduceOp op, bool even,
                                         int64_t offset) {
  Type type;
  Op kop;
  if (even && nativeReduce(out.scalar_type(), op.op_, type, kop)) {
    at::Tensor o = out.is_contiguous() ? out : out.contiguous();
    group_->reduceScatter(flat.data_ptr(), o.data_ptr(), static_cast<size_t>(o.numel()), type, kop);
    if (!o.is_same(out)) out.copy_(o);
    return;
  }
  // Uneven blocks or no kernel: reduce everything (a copy: `flat` may be the caller's
  // input), keep this rank's block.
  at::Tensor all = flat.clone();
  allreduceInPlace(all, op);
  out.copy_(all.narrow(0, offset, out.numel()).view(out.sizes()));
}

}  // namespace kolo_torch
