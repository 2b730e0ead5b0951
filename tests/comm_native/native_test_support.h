// Test doubles and launchers for the native communicator tests: a thread-safe in-memory
// store, a directory store usable across fork(), and helpers that run a function on N
// ranks as threads or as forked processes.
#pragma once

#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/native.h"
#include "kolo/error.h"

namespace kolo::comm::testing {

/// Keys in a map guarded by a mutex; waits on a condition variable.
class ThreadStore : public Store {
 public:
  void set(const std::string& key, const Bytes& value) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      data_[key] = value;
    }
    cv_.notify_all();
  }
  Bytes get(const std::string& key, Millis timeout) override {
    wait({key}, timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    return data_[key];
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] {
          for (const auto& k : keys)
            if (!data_.count(k)) return false;
          return true;
        }))
      KOLO_THROW(Timeout, "test store: keys missing after ", timeout.count(), " ms");
  }
  int64_t add(const std::string& key, int64_t delta) override {
    std::lock_guard<std::mutex> lock(mutex_);
    int64_t v = 0;
    auto it = data_.find(key);
    if (it != data_.end()) v = std::stoll(std::string(it->second.begin(), it->second.end()));
    v += delta;
    std::string s = std::to_string(v);
    data_[key] = Bytes(s.begin(), s.end());
    cv_.notify_all();
    return v;
  }
  bool remove(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mutex_);
    return data_.erase(key) > 0;
  }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& k : keys)
      if (!data_.count(k)) return false;
    return true;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::string, Bytes> data_;
};

/// One file per key in a directory (written to a temporary name, then renamed); waits poll.
class DirectoryStore : public Store {
 public:
  explicit DirectoryStore(std::string dir) : dir_(std::move(dir)) { std::filesystem::create_directories(dir_); }
  void set(const std::string& key, const Bytes& value) override {
    const std::string path = pathOf(key);
    const std::string tmp = path + ".tmp" + std::to_string(getpid()) + "_" +
                            std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
    {
      std::ofstream out(tmp, std::ios::binary);
      out.write(reinterpret_cast<const char*>(value.data()), static_cast<std::streamsize>(value.size()));
    }
    std::filesystem::rename(tmp, path);
  }
  Bytes get(const std::string& key, Millis timeout) override {
    wait({key}, timeout);
    std::ifstream in(pathOf(key), std::ios::binary);
    return Bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!check(keys)) {
      if (std::chrono::steady_clock::now() > deadline) KOLO_THROW(Timeout, "directory store: keys missing");
      usleep(1000);
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    const std::string lockPath = dir_ + "/.lock";
    int fd = open(lockPath.c_str(), O_CREAT | O_RDWR, 0600);
    flock(fd, LOCK_EX);
    int64_t v = 0;
    if (check({key})) {
      Bytes b = get(key, Millis(1000));
      v = std::stoll(std::string(b.begin(), b.end()));
    }
    v += delta;
    std::string s = std::to_string(v);
    set(key, Bytes(s.begin(), s.end()));
    flock(fd, LOCK_UN);
    close(fd);
    return v;
  }
  bool remove(const std::string& key) override { return std::filesystem::remove(pathOf(key)); }
  bool check(const std::vector<std::string>& keys) override {
    for (const auto& k : keys)
      if (!std::filesystem::exists(pathOf(k))) return false;
    return true;
  }

 private:
  std::string pathOf(const std::string& key) const {
    std::string name;
    for (char c : key) name += (c == '/' ? '_' : c);
    return dir_ + "/" + name;
  }
  std::string dir_;
};

using RankBody = std::function<void(Communicator&)>;

/// Runs body on n ranks, each a thread with its own communicator built with
/// optionsFor(rank); rethrows the first error.
inline void runThreadsWith(int n, const RankBody& body, const std::function<NativeOptions(int)>& optionsFor) {
  auto store = std::make_shared<ThreadStore>();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = createNativeCommunicator(store, r, n, optionsFor(r));
        body(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

/// runThreadsWith with the same options on every rank.
inline void runThreads(int n, const RankBody& body, NativeOptions options = {}) {
  runThreadsWith(n, body, [options](int) { return options; });
}

/// A fresh directory under /tmp for a forked job's store.
inline std::string freshDirectory() {
  char tmpl[] = "/tmp/kolo-native-test-XXXXXX";
  const char* d = mkdtemp(tmpl);
  if (d == nullptr) KOLO_THROW(IoError, "mkdtemp failed");
  return d;
}

/// Forks n rank processes running body(rank, comm); returns each child's exit status
/// (0 = body returned; 1 = it threw, with the message on stderr). `beforeCreate` runs in
/// the child before the communicator exists (e.g. to stop itself).
inline std::vector<int> runProcessesWith(int n, const std::function<int(int, Communicator&)>& body,
                                         const std::function<NativeOptions(int)>& optionsFor,
                                         const std::function<void(const std::vector<pid_t>&)>& whileRunning = {}) {
  const std::string dir = freshDirectory();
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        auto store = std::make_shared<DirectoryStore>(dir);
        auto comm = createNativeCommunicator(store, r, n, optionsFor(r));
        code = body(r, *comm);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        code = 1;
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  if (whileRunning) whileRunning(pids);
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  std::filesystem::remove_all(dir);
  return codes;
}

/// runProcessesWith with the same options on every rank.
inline std::vector<int> runProcesses(int n, const std::function<int(int, Communicator&)>& body,
                                     NativeOptions options = {},
                                     const std::function<void(const std::vector<pid_t>&)>& whileRunning = {}) {
  return runProcessesWith(n, body, [options](int) { return options; }, whileRunning);
}

}  // namespace kolo::comm::testing
