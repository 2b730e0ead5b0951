// The order in which a process group's operations run: one at a time, in issue order, on
// the group's worker thread or on a thread that waits for one of them. A caller that
// blocks on its operation runs it itself, and the worker does not wake for each operation
// (it looks in once per claim window while operations come): a blocking call then costs no
// switch between threads, which on an oversubscribed host is a trip through the scheduler
// for every rank.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>

namespace kolo_torch {

/// Shared by a group and its Works (a Work may outlive its group). Thread-safe.
class TaskQueue {
 public:
  /// A task nobody claims or hurries has waited one to two of these when the worker runs it.
  static constexpr std::chrono::microseconds kClaimWindow{1000};
  /// Windows without a new task after which the worker sleeps until the next one comes.
  static constexpr int kIdleWindows = 8;

  /// Appends `run`, the operation that completes the Work `key`. The worker runs it after
  /// the claim window unless a caller claims it first (runThrough) or hurry() is called.
  void push(const void* key, std::function<void()> run);
  /// Has the worker run what is queued now: nobody is going to claim it (a future was asked
  /// for, completion is being polled, a wait has a timeout).
  void hurry();
  /// The worker thread's loop; returns once stop() was called and every task has run.
  void serve();
  /// On a thread that is about to block until `key`'s task has run: when no task runs now,
  /// runs the queued tasks up to and including `key`'s here, in order. Returns at once when
  /// `key` is not queued (it runs or ran) or the worker runs a task (it will run `key`'s).
  void runThrough(const void* key);
  /// Makes serve() return once the queue is empty and no task runs.
  void stop();

 private:
  struct Task {
    const void* key = nullptr;
    std::function<void()> run;
    uint64_t number = 0;  // the pushes before it
  };
  /// Runs the front task with `lock` released; `lock` is held again on return.
  void runFront(std::unique_lock<std::mutex>& lock);

  std::mutex mutex_;
  std::condition_variable cv_;  // the worker's sleep
  std::deque<Task> tasks_;
  uint64_t pushes_ = 0;
  bool running_ = false;  // a task taken from tasks_ runs (on the worker or a waiting caller)
  bool urgent_ = false;   // the worker runs everything queued, without a window
  bool parked_ = false;   // the worker sleeps until a push (or hurry, or stop) wakes it
  bool awaitingRunner_ = false;  // the worker sleeps until the caller that runs a task is done
  bool stopping_ = false;
};

}  // namespace kolo_torch
