// ProcessGroupKolo: torch.distributed's process-group interface (c10d, torch 1.13) over a
// kolo Group. Operations run in issue order, one at a time, on one worker thread per group
// or on a thread that waits for them (see KoloWork::wait); point-to-point transfers are
// posted there and completed by a second thread, so a pending recv never holds back the
// collectives behind it. Compiled at torch's C++ standard (C++17).
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bridge.h"
#include "task_queue.h"

namespace kolo_torch {

/// The Work of one operation: completes (and completes its future with `outputs`) when it
/// has run; keeps its tensors alive until then.
class KoloWork : public c10d::Work {
 public:
  /// An operation that `queue` runs.
  KoloWork(int rank, c10d::OpType type, const char* title, std::vector<at::Tensor> outputs,
           std::shared_ptr<TaskQueue> queue);
  /// Without a timeout, first runs this operation on the calling thread when it has not
  /// started and the worker is idle (TaskQueue::runThrough); then waits as c10d's Work does.
  /// With one, has the worker run it (the caller gets control back when the timeout passes).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  /// Whether it has run; a caller that polls has the worker start it now.
  bool isCompleted() override;
  /// Made on the first request, completed when the work is (at once if it already is): an
  /// operation whose future nobody asks for completes without waking a completer thread.
  /// The worker starts the operation now: whoever chains on the future will not run it.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override { return sourceRank_; }
  /// Marks the work done, with `error` when it failed (wait() returns or throws). Returns
  /// the future when one was requested: the caller completes it (completeFuture).
  c10::intrusive_ptr<c10::ivalue::Future> finishWork(std::exception_ptr error);
  /// Completes `future`; its callbacks run here, and may block.
  void completeFuture(const c10::intrusive_ptr<c10::ivalue::Future>& future, std::exception_ptr error);
  void setSourceRank(int rank) { sourceRank_ = rank; }

 private:
  std::vector<at::Tensor> outputs_;
  std::shared_ptr<TaskQueue> queue_;
  std::mutex futureMutex_;  // future_, finished_, error_
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  bool finished_ = false;
  std::exception_ptr error_;
  int sourceRank_ = -1;
};

/// Rejects a (dtype, op) that no backend defines, on the caller's thread, naming `what`.
void checkReduce(const at::Tensor& t, c10d::ReduceOp op, const char* what);

class ProcessGroupKolo : public c10d::ProcessGroup {
 public:
  /// Collective over `size` ranks: rendezvous through `store` (torch's PrefixStore of this
  /// group) within `timeout`, which also bounds every later operation.
  ProcessGroupKolo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   std::chrono::milliseconds timeout);
  ~ProcessGroupKolo() override;

  const std::string getBackendName() const override { return "kolo"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplits, std::vector<int64_t>& inputSplits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  struct PendingTransfer {
    c10::intrusive_ptr<KoloWork> work;
    std::string what;
    std::unique_ptr<Transfer> transfer;
    at::Tensor staging;  // received into, then copied to `target`, when that is not contiguous
    at::Tensor target;
  };
  struct Completion {
    c10::intrusive_ptr<KoloWork> work;
    c10::intrusive_ptr<c10::ivalue::Future> future;
    std::exception_ptr error;
  };

  /// Queues `body` behind every earlier operation of this group; returns its Work.
  c10::intrusive_ptr<c10d::Work> enqueue(const char* name, c10d::OpType type, std::vector<at::Tensor> outputs,
                                         std::function<void(KoloWork&)> body, bool transfer = false);
  /// recv and recvAnysource (`src` -1): a receive into tensors[0], its sender set on the work.
  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag);
  /// From a transfer task's body: the transfer thread waits for `transfer`, copies
  /// `staging` into `target` when staging is defined, then completes `work`.
  void postTransfer(KoloWork& work, const std::string& what, std::unique_ptr<Transfer> transfer,
                    at::Tensor staging = {}, at::Tensor target = {});
  /// All-reduce of `t` (contiguous) in place, natively where kolo has the type and op, else
  /// as an all-gather reduced here in rank order (the same bits on every rank).
  void allreduceInPlace(at::Tensor& t, c10d::ReduceOp op);
  /// Reduce of `t` (contiguous) in place to `root`.
  void reduceInPlace(at::Tensor& t, c10d::ReduceOp op, int root);
  /// Reduce-scatter of `flat` (contiguous, every rank's blocks in rank order) into `out`,
  /// this rank's block, which starts at element `offset`; `even`: every block has out's size.
  void reduceScatterFlat(const at::Tensor& flat, at::Tensor& out, c10d::ReduceOp op, bool even, int64_t offset);
  std::exception_ptr describe(const std::string& what, std::exception_ptr error) const;
  /// Lets the threads finish every issued operation, then joins them.
  void shutdown();
  /// Runs `body` (on the worker or a waiting caller; `what` is "allreduce #4", for error
  /// messages) and completes `work`, unless the body posted a transfer, which does.
  void runTask(const c10::intrusive_ptr<KoloWork>& work, const std::string& what,
               const std::function<void(KoloWork&)>& body, bool transfer);
  void transferLoop();
  /// Finishes `work` now and completes its future, when one was requested, on a completer
  /// thread: the future's callbacks (DDP's hooks) may issue operations of this group and
  /// wait for them, so they must not run where tasks run. A new completer starts whenever
  /// every one is busy.
  void complete(const c10::intrusive_ptr<KoloWork>& work, std::exception_ptr error);

  /// The completers' queue, which each completer thread holds too: the group's last
  /// reference may go in a future's callback, on a completer, whose loop then outlives the
  /// group (shutdown() detaches that thread instead of joining itself).
  struct Completions {
    std::mutex mutex;
    std::condition_variable cv;  // items, stopping
    std::deque<Completion> items;
    size_t idle = 0;
    bool stopping = false;
    std::vector<std::thread> threads;
  };
  static void completerLoop(const std::shared_ptr<Completions>& state);

  std::shared_ptr<Group> group_;
  c10::intrusive_ptr<c10d::Store> store_;
  uint64_t issued_ = 0;

  std::shared_ptr<TaskQueue> tasks_ = std::make_shared<TaskQueue>();
  std::mutex mutex_;
  std::condition_variable transferCv_;  // transfers_
  std::deque<PendingTransfer> transfers_;
  bool stopping_ = false;
  bool transfersStopping_ = false;
  const std::string* current_ = nullptr;  // the running task's name, for transfers it posts
  std::thread worker_;
  std::thread transferThread_;
  std::shared_ptr<Completions> completions_ = std::make_shared<Completions>();
};

}  // namespace kolo_torch
