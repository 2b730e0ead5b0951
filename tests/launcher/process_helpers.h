// Test helpers: start a program with a chosen environment, its stdout and stderr captured
// through pipes, and collect both plus the exit status; check whether a pid is gone; a
// fixture with a temporary directory.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace kolo::testing {

/// A test with its own fresh directory, dir_, removed with everything in it afterwards.
class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kolo_launcher_XXXXXX";
    const char* made = ::mkdtemp(pattern);
    ASSERT_NE(made, nullptr) << "mkdtemp: " << std::strerror(errno);
    dir_ = made;
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

struct Child {
  pid_t pid = -1;
  int outFd = -1;
  int errFd = -1;
};

struct Result {
  int status = 0;  // as from waitpid
  std::string out;
  std::string err;
  int exitCode() const { return WIFEXITED(status) ? WEXITSTATUS(status) : -1; }
};

/// Names under /dev/shm that mention kolo. kolo's shared memory has no name, so a name here
/// after a job is what a leak would look like.
inline std::set<std::string> koloNamesInDevShm() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string name = entry.path().filename().string();
    // Open MPI's segments carry their host's name, which the network-namespace tests running
    // beside this one set to kolo-h1, kolo-h2: those are not kolo's.
    const bool openMpi = name.rfind("vader_segment.", 0) == 0 || name.rfind("sm_segment.", 0) == 0;
    if (name.find("kolo") != std::string::npos && !openMpi) names.insert(name);
  }
  return names;
}

/// A rank's `sh -c` script: starts `sleep seconds` in the background, writes that child's
/// pid to dir/child.$KOLO_RANK and the shell's to dir/pid.$KOLO_RANK (each renamed into
/// place whole), then waits.
inline std::string sleepingRankScript(const std::string& dir, int seconds) {
  const std::string rank = ".$KOLO_RANK";
  return "sleep " + std::to_string(seconds) + " & echo $! > " + dir + "/c.tmp" + rank + "; mv " + dir +
         "/c.tmp" + rank + " " + dir + "/child" + rank + "; echo $$ > " + dir + "/p.tmp" + rank + "; mv " +
         dir + "/p.tmp" + rank + " " + dir + "/pid" + rank + "; wait";
}

/// The test process's environment without the variables any launcher sets, plus `extra`
/// (which replaces a variable of the same name).
inline std::vector<std::string> cleanEnvironment(
    const std::map<std::string, std::string>& extra = {}) {
  static const char* kLauncherVars[] = {
      "KOLO_",        "RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
      "MASTER_PORT=", "OMPI_", "PMIX_",       "SLURM_",      "TORCHELASTIC_", "GLIBC_TUNABLES="};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    bool drop = false;
    for (const char* prefix : kLauncherVars) drop = drop || entry.rfind(prefix, 0) == 0;
    for (const auto& [k, v] : extra) drop = drop || entry.rfind(k + "=", 0) == 0;  // replaced below
    if (!drop) env.push_back(entry);
  }
  for (const auto& [k, v] : extra) env.push_back(k + "=" + v);
  return env;
}

inline Child spawnChild(const std::vector<std::string>& args, const std::vector<std::string>& env) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) return {};
  std::vector<char*> argv, envp;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  Child child;
  if (::posix_spawnp(&child.pid, argv[0], &actions, nullptr, argv.data(), envp.data()) != 0)
    child.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  ::close(out[1]);
  ::close(err[1]);
  child.outFd = out[0];
  child.errFd = err[0];
  return child;
}

/// Reads both pipes to their end, then reaps the child.
inline Result collect(Child& child) {
  Result result;
  while (child.outFd >= 0 || child.errFd >= 0) {
    pollfd fds[2] = {{child.outFd, POLLIN, 0}, {child.errFd, POLLIN, 0}};
    ::poll(fds, 2, -1);
    for (int i = 0; i < 2; ++i) {
      int& fd = i == 0 ? child.outFd : child.errFd;
      if (fd < 0 || !fds[i].revents) continue;
      char buf[65536];
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      } else {
        ::close(fd);
        fd = -1;
      }
    }
  }
  ::waitpid(child.pid, &result.status, 0);
  return result;
}

inline Result runProgram(const std::vector<std::string>& args,
                         const std::vector<std::string>& env) {
  Child child = spawnChild(args, env);
  return collect(child);
}

inline std::vector<std::string> splitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

/// True when no live process has this pid (a zombie counts as gone).
inline bool processGone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string content((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t close = content.rfind(')');
  return close == std::string::npos || close + 2 >= content.size() || content[close + 2] == 'Z';
}

/// Waits (up to `limit`) until `ready()` holds; returns whether it did.
template <class Ready>
bool waitFor(Ready ready, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (!ready()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

inline std::string readFile(const std::string& path) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s;
}

/// Processes the launcher `pid` started from its main thread (ranks and its guard).
inline std::vector<pid_t> childrenOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  for (pid_t child; in >> child;) children.push_back(child);
  return children;
}

/// KOLO_RANK from a process's environment, or -1 (not a rank, or not exec'd yet).
inline int rankOf(pid_t pid) {
  std::string environ = readFile("/proc/" + std::to_string(pid) + "/environ");
  const std::string key = "KOLO_RANK=";
  for (size_t at = 0; at < environ.size();) {
    size_t end = environ.find('\0', at);
    if (end == std::string::npos) end = environ.size();
    if (environ.compare(at, key.size(), key) == 0)
      return std::atoi(environ.c_str() + at + key.size());
    at = end + 1;
  }
  return -1;
}

}  // namespace kolo::testing
