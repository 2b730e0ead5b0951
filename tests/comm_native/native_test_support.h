// Launchers for the native communicator tests: run a function on N ranks as threads over
// the library's in-memory store, or as forked processes over its file store.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kolo/comm/native.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm::testing {

using RankBody = std::function<void(Communicator&)>;

/// Runs body on n ranks, each a thread with its own communicator built with
/// optionsFor(rank); rethrows the first error.
inline void runThreadsWith(int n, const RankBody& body, const std::function<NativeOptions(int)>& optionsFor) {
  auto store = makeMemoryStore();
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
        auto store = makeFileStore(dir);
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
