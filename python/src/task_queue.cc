// TaskQueue: issue-order execution of a group's operations by a waiting caller, or by the
// worker once a task has gone unclaimed for a claim window.
#include "task_queue.h"

#include <algorithm>

namespace kolo_torch {

void TaskQueue::push(const void* key, std::function<void()> run) {
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(Task{key, std::move(run), pushes_++});
    // A parked worker starts looking again; one that looks in every window needs no call.
    wake = parked_;
    parked_ = false;
  }
  if (wake) cv_.notify_one();
}

void TaskQueue::hurry() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (tasks_.empty()) return;
    urgent_ = true;
  }
  cv_.notify_one();
}

void TaskQueue::runFront(std::unique_lock<std::mutex>& lock) {
  Task task = std::move(tasks_.front());
  tasks_.pop_front();
  running_ = true;
  lock.unlock();
  task.run();     // the closure reports its own errors: it completes its Work
  task = Task{};  // its tensors and Work go before the next task may start
  lock.lock();
  running_ = false;
}

void TaskQueue::serve() {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t stale = 0;  // tasks numbered below this were queued a whole window ago
  int idleWindows = 0;
  for (;;) {
    while (!running_ && !tasks_.empty() && (urgent_ || stopping_ || tasks_.front().number < stale))
      runFront(lock);
    if (tasks_.empty()) urgent_ = false;
    if (stopping_ && tasks_.empty() && !running_) return;
    if (running_) {
      // A caller runs a task, perhaps a long one: looking in meanwhile would take a CPU from
      // the ranks that run it. It wakes us when done (runThrough), whatever came meanwhile.
      awaitingRunner_ = true;
      cv_.wait(lock, [&] { return !running_; });
      awaitingRunner_ = false;
      continue;
    }
    idleWindows = pushes_ == stale ? idleWindows + 1 : 0;
    if (idleWindows >= kIdleWindows) {
      // Nothing came for a while: sleep until something does.
      parked_ = true;
      cv_.wait(lock, [&] { return !parked_ || urgent_ || stopping_; });
      parked_ = false;
      idleWindows = 0;
      if (urgent_ || stopping_) continue;
    }
    // A task pushed by now gets a whole window for its caller to claim it.
    stale = pushes_;
    cv_.wait_for(lock, kClaimWindow);  // an early wake (hurry, stop) only runs tasks sooner
  }
}

void TaskQueue::runThrough(const void* key) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto mine =
      std::find_if(tasks_.begin(), tasks_.end(), [&](const Task& t) { return t.key == key; });
  if (mine == tasks_.end()) return;
  if (running_) {
    urgent_ = true;  // the runner goes on to ours (the worker without a window) when done
    return;
  }
  // Earlier tasks first: the peers run them in this order too. The worker does not start
  // one while we run (running_), so it never reorders them.
  for (auto left = std::distance(tasks_.begin(), mine) + 1; left > 0; --left) runFront(lock);
  // Whatever was issued meanwhile (by other threads), and the stop, are the worker's now.
  if (!tasks_.empty()) urgent_ = true;
  const bool wake = stopping_ || !tasks_.empty() || awaitingRunner_;
  lock.unlock();
  if (wake) cv_.notify_one();
}

void TaskQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_one();
}

}  // namespace kolo_torch
