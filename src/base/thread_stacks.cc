// Capturing every thread's stack: the capturing thread sends each other thread of the process
// the stack signal (tgkill) and waits, bounded, for its handler to record its return addresses
// with glibc's backtrace() into one shared slot (captures run one at a time). backtrace() is
// safe there once libgcc's unwinder is loaded, which prepareStackCapture() does. The addresses
// are named afterwards, outside any handler: with elfutils' libdwfl (the symbol tables of the
// executable and of every library, static functions included) when kolo was built with it,
// else with dladdr (exported symbols only); C++ names are demangled.
#include "base/thread_stacks.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>

#include "base/json_text.h"

#if KOLO_HAVE_LIBDW
#include <elfutils/libdwfl.h>
#endif

namespace kolo::flight::detail {
namespace {

constexpr int kMaxFrames = 48;

// The one capture in flight. state: 0 idle, 1 asked (tid set), 2 being written by the
// handler, 3 written.
struct Slot {
  std::atomic<int> state{0};
  std::atomic<int> tid{0};
  int depth = 0;
  void* frames[kMaxFrames] = {};
};
Slot gSlot;
// glibc's signal trampoline (__restore_rt, the sa_restorer it installs): a frame there is
// where a signal handler was entered. 0 when unknown.
std::atomic<uintptr_t> gTrampoline{0};

int stackSignal() { return SIGRTMIN + 4; }

pid_t currentTid() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

void onStackSignal(int) {
  const int saved = errno;
  int asked = 1;
  if (gSlot.tid.load(std::memory_order_acquire) == currentTid() &&
      gSlot.state.compare_exchange_strong(asked, 2, std::memory_order_acq_rel)) {
    gSlot.depth = ::backtrace(gSlot.frames, kMaxFrames);
    gSlot.state.store(3, std::memory_order_release);
  }
  errno = saved;
}

std::string threadName(int tid) {
  std::ifstream in("/proc/self/task/" + std::to_string(tid) + "/comm");
  std::string name;
  std::getline(in, name);
  return name;
}

std::vector<int> threadIds(int limit) {
  std::vector<int> tids;
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  while (dirent* entry = ::readdir(dir)) {
    const int tid = std::atoi(entry->d_name);
    if (tid > 0 && static_cast<int>(tids.size()) < limit) tids.push_back(tid);
  }
  ::closedir(dir);
  std::sort(tids.begin(), tids.end());  // the main thread (tid == pid) first
  return tids;
}

std::string demangle(const char* name) {
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && plain ? plain : name;
  std::free(plain);
  return out;
}

std::string baseName(const char* path) {
  const char* slash = path ? std::strrchr(path, '/') : nullptr;
  return slash ? slash + 1 : (path ? path : "?");
}

// Names addresses: "function (module)".
class Symbolizer {
 public:
  Symbolizer() {
#if KOLO_HAVE_LIBDW
    static const Dwfl_Callbacks callbacks = {dwfl_linux_proc_find_elf, dwfl_standard_find_debuginfo, nullptr,
                                             nullptr};
    dwfl_ = dwfl_begin(&callbacks);
    if (dwfl_ && (dwfl_linux_proc_report(dwfl_, ::getpid()) != 0 || dwfl_report_end(dwfl_, nullptr, nullptr) != 0)) {
      dwfl_end(dwfl_);
      dwfl_ = nullptr;
    }
#endif
  }
  ~Symbolizer() {
#if KOLO_HAVE_LIBDW
    if (dwfl_) dwfl_end(dwfl_);
#endif
  }
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // `returnAddress`: the frame's pc is a return address, so look up the call before it.
  std::string name(void* address, bool returnAddress) const {
    const auto pc = reinterpret_cast<uintptr_t>(address) - (returnAddress ? 1 : 0);
#if KOLO_HAVE_LIBDW
    if (dwfl_) {
      if (Dwfl_Module* module = dwfl_addrmodule(dwfl_, pc)) {
        const char* moduleName = dwfl_module_info(module, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                  nullptr);
        if (const char* symbol = dwfl_module_addrname(module, pc))
          return demangle(symbol) + " (" + baseName(moduleName) + ")";
        return hex(pc) + " (" + baseName(moduleName) + ")";
      }
    }
#endif
    Dl_info info{};
    if (::dladdr(reinterpret_cast<void*>(pc), &info) != 0) {
      if (info.dli_sname) return demangle(info.dli_sname) + " (" + baseName(info.dli_fname) + ")";
      return hex(pc - reinterpret_cast<uintptr_t>(info.dli_fbase)) + " (" + baseName(info.dli_fname) + ")";
    }
    return hex(pc);
  }

 private:
  static std::string hex(uintptr_t value) {
    char text[32];
    std::snprintf(text, sizeof text, "0x%lx", static_cast<unsigned long>(value));
    return text;
  }
#if KOLO_HAVE_LIBDW
  Dwfl* dwfl_ = nullptr;
#endif
};

// The frames below the last signal trampoline: a handler's own frames are not what the
// thread was doing (ours, and any other it was running when ours came, such as the
// recorder's SIGUSR1 handler); for the calling thread, below this file's functions.
std::vector<std::string> nameFrames(const Symbolizer& names, void* const* frames, int depth, bool inHandler) {
  std::vector<std::string> out;
  int first = 0;
  const uintptr_t trampoline = gTrampoline.load(std::memory_order_relaxed);
  for (int i = 0; i < depth; ++i) {
    const auto pc = reinterpret_cast<uintptr_t>(frames[i]);
    if (trampoline != 0 && pc >= trampoline && pc < trampoline + 16) first = i + 1;
  }
  if (inHandler && first == 0) {  // trampoline unknown: find it by name, else skip handler + trampoline
    for (int i = 0; i < depth && i < 4; ++i)
      if (names.name(frames[i], false).rfind("__restore_rt", 0) == 0) first = i + 1;
    if (first == 0) first = std::min(depth, 2);
  }
  for (int i = first; i < depth; ++i) {
    std::string frame = names.name(frames[i], i > first || !inHandler);
    if (!inHandler && out.empty() && (frame.find("kolo::flight::") != std::string::npos)) continue;
    out.push_back(std::move(frame));
  }
  return out;
}

}  // namespace

void prepareStackCapture() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  void* warm[2];
  ::backtrace(warm, 2);  // loads libgcc_s now, not inside a handler
  struct sigaction action {};
  action.sa_handler = onStackSignal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  ::sigaction(stackSignal(), &action, nullptr);
  struct sigaction installed {};
  if (::sigaction(stackSignal(), nullptr, &installed) == 0)
    gTrampoline.store(reinterpret_cast<uintptr_t>(installed.sa_restorer), std::memory_order_relaxed);
}

std::vector<ThreadStack> captureThreadStacks(std::chrono::milliseconds perThread, int maxThreads) {
  std::vector<ThreadStack> stacks;
  try {
    prepareStackCapture();
    const Symbolizer names;
    const pid_t self = currentTid();
    for (const int tid : threadIds(maxThreads)) {
      ThreadStack stack;
      stack.tid = tid;
      stack.name = threadName(tid);
      if (tid == self) {
        void* frames[kMaxFrames];
        const int depth = ::backtrace(frames, kMaxFrames);
        stack.answered = true;
        stack.frames = nameFrames(names, frames, depth, false);
        stacks.push_back(std::move(stack));
        continue;
      }
      gSlot.depth = 0;
      gSlot.tid.store(tid, std::memory_order_release);
      gSlot.state.store(1, std::memory_order_release);
      if (::syscall(SYS_tgkill, ::getpid(), tid, stackSignal()) == 0) {
        // Bounded poll: the thread runs its handler when next scheduled.
        const auto deadline = std::chrono::steady_clock::now() + perThread;
        while (gSlot.state.load(std::memory_order_acquire) != 3 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      int asked = 1;
      if (!gSlot.state.compare_exchange_strong(asked, 0, std::memory_order_acq_rel)) {
        // The handler took it: wait until it has written (a few microseconds).
        while (gSlot.state.load(std::memory_order_acquire) != 3) std::this_thread::yield();
        stack.answered = true;
        stack.frames = nameFrames(names, gSlot.frames, gSlot.depth, true);
        gSlot.state.store(0, std::memory_order_release);
      }
      gSlot.tid.store(0, std::memory_order_release);
      stacks.push_back(std::move(stack));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kolo: thread stacks not captured: %s\n", e.what());
  }
  return stacks;
}

std::string stacksJson(const std::vector<ThreadStack>& stacks) {
  std::string out = "[";
  for (size_t i = 0; i < stacks.size(); ++i) {
    const ThreadStack& s = stacks[i];
    out += i ? ",\n{\"tid\":" : "\n{\"tid\":";
    out += std::to_string(s.tid) + ",\"name\":\"";
    kolo::detail::appendJsonEscaped(out, s.name.c_str(), s.name.size());
    out += "\",\"answered\":";
    out += s.answered ? "true" : "false";
    out += ",\"frames\":[";
    for (size_t f = 0; f < s.frames.size(); ++f) {
      out += f ? ",\"" : "\"";
      kolo::detail::appendJsonEscaped(out, s.frames[f].c_str(), s.frames[f].size());
      out += "\"";
    }
    out += "]}";
  }
  out += "]";
  return out;
}

}  // namespace kolo::flight::detail
