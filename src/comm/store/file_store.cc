// The file Store: one file per key in a directory all participants see. Values are
// written to a temporary file and renamed into place, so a reader sees the whole value or
// nothing; `add` and `remove` serialise through flock on one lock file; waits poll with
// exponential backoff (1 ms doubling to 50 ms).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>

#include "comm/store/store_detail.h"
#include "comm/token.h"
#include "kolo/comm/stores.h"
#include "kolo/error.h"

namespace kolo::comm {
namespace {

constexpr size_t kMaxPlainNameBytes = 180;

/// 64-bit FNV-1a, used to name files for keys too long for a file name.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

/// Key -> file name: [A-Za-z0-9._-] kept, every other byte as %XX; names that would be too
/// long become a hash of the key plus the start of its encoding.
std::string fileNameForKey(const std::string& key) {
  std::string name = "k.";
  for (unsigned char c : key) {
    if (std::isalnum(c) || c == '.' || c == '_' || c == '-') {
      name += static_cast<char>(c);
    } else {
      name += '%' + detail::hexText(&c, 1);
    }
  }
  if (name.size() <= kMaxPlainNameBytes) return name;
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a(key)));
  return "h." + std::string(hash) + "." + name.substr(2, 100);
}

std::string errnoText() { return std::strerror(errno); }

class FileStore : public Store {
 public:
  explicit FileStore(std::string directory) : directory_(std::move(directory)) {
    // Temporary names must not collide between processes on different hosts sharing the
    // directory, nor between store objects of one process.
    nonce_ = detail::randomToken(8);
    std::error_code ec;
    std::filesystem::create_directories(directory_, ec);
    if (ec || !std::filesystem::is_directory(directory_))
      KOLO_THROW(IoError, "file store: cannot create directory '", directory_, "': ", ec.message());
  }

  void set(const std::string& key, const Bytes& value) override {
    detail::checkStoreKey(key);
    detail::checkStoreValue(key, value);
    writeAtomically(key, value);
  }

  Bytes get(const std::string& key, Millis timeout) override {
    detail::checkStoreKey(key);
    Bytes value;
    pollUntil(
        timeout, [&] { return readValue(key, &value); },
        [&] { detail::throwStoreTimeout("file get in '" + directory_ + "'", {key}, timeout); });
    return value;
  }

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    for (const auto& key : keys) detail::checkStoreKey(key);
    pollUntil(
        timeout, [&] { return missing(keys).empty(); },
        [&] {
          detail::throwStoreTimeout("file wait in '" + directory_ + "'", missing(keys), timeout);
        });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    detail::checkStoreKey(key);
    LockFile lock(directory_);
    Bytes value;
    int64_t result = detail::addToCounter(key, readValue(key, &value) ? &value : nullptr, delta);
    writeAtomically(key, detail::encodeCounter(result));
    return result;
  }

  bool remove(const std::string& key) override {
    detail::checkStoreKey(key);
    LockFile lock(directory_);
    std::string path = pathFor(key);
    if (::unlink(path.c_str()) == 0) return true;
    if (errno == ENOENT) return false;
    KOLO_THROW(IoError, "file store: cannot remove '", path, "': ", errnoText());
  }

  bool check(const std::vector<std::string>& keys) override {
    for (const auto& key : keys) detail::checkStoreKey(key);
    return missing(keys).empty();
  }

 private:
  /// Exclusive flock on `<dir>/lock` for the lifetime of the object.
  class LockFile {
   public:
    explicit LockFile(const std::string& directory) {
      std::string path = directory + "/lock";
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
      if (fd_ < 0)
        KOLO_THROW(IoError, "file store: cannot open lock file '", path, "': ", errnoText());
      while (::flock(fd_, LOCK_EX) != 0) {
        if (errno == EINTR) continue;
        int saved = errno;
        ::close(fd_);
        KOLO_THROW(IoError, "file store: cannot lock '", path, "': ", std::strerror(saved));
      }
    }
    ~LockFile() { ::close(fd_); }  // closing releases the lock
    LockFile(const LockFile&) = delete;
    LockFile& operator=(const LockFile&) = delete;

   private:
    int fd_ = -1;
  };

  std::string pathFor(const std::string& key) const {
    return directory_ + "/" + fileNameForKey(key);
  }

  template <class Ready, class OnTimeout>
  void pollUntil(Millis timeout, Ready ready, OnTimeout onTimeout) {
    auto deadline = detail::deadlineAfter(timeout);
    auto pause = std::chrono::milliseconds(1);
    while (!ready()) {
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline) onTimeout();
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }

  /// Reads key's file into *value; false when the key does not exist.
  bool readValue(const std::string& key, Bytes* value) const {
    std::string path = pathFor(key);
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT) return false;
      KOLO_THROW(IoError, "file store: cannot open '", path, "': ", errnoText());
    }
    value->clear();
    uint8_t chunk[65536];
    for (;;) {
      ssize_t n = ::read(fd, chunk, sizeof chunk);
      if (n == 0) break;
      if (n < 0) {
        if (errno == EINTR) continue;
        int saved = errno;
        ::close(fd);
        KOLO_THROW(IoError, "file store: cannot read '", path, "': ", std::strerror(saved));
      }
      value->insert(value->end(), chunk, chunk + n);
      if (value->size() > kMaxStoreValueBytes) {
        ::close(fd);
        KOLO_THROW(FormatError, "file store: '", path, "' is larger than the value limit of ",
                   kMaxStoreValueBytes);
      }
    }
    ::close(fd);
    return true;
  }

  std::vector<std::string> missing(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    for (const auto& key : keys) {
      struct stat st;
      if (::stat(pathFor(key).c_str(), &st) != 0) out.push_back(key);
    }
    return out;
  }

  /// Writes a uniquely named temporary file, then renames it over the key's file.
  void writeAtomically(const std::string& key, const Bytes& value) {
    std::string path = pathFor(key);
    std::string temp = directory_ + "/.tmp." + nonce_ + "." + std::to_string(::getpid()) + "." +
                       std::to_string(sequence_.fetch_add(1));
    int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) KOLO_THROW(IoError, "file store: cannot create '", temp, "': ", errnoText());
    size_t done = 0;
    while (done < value.size()) {
      ssize_t n = ::write(fd, value.data() + done, value.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        int saved = errno;
        ::close(fd);
        ::unlink(temp.c_str());
        KOLO_THROW(IoError, "file store: cannot write '", temp, "': ", std::strerror(saved));
      }
      done += static_cast<size_t>(n);
    }
    ::close(fd);
    if (::rename(temp.c_str(), path.c_str()) != 0) {
      int saved = errno;
      ::unlink(temp.c_str());
      KOLO_THROW(IoError, "file store: cannot rename '", temp, "' to '", path,
                 "': ", std::strerror(saved));
    }
  }

  std::string directory_;
  std::string nonce_;
  std::atomic<uint64_t> sequence_{0};
};

}  // namespace

std::shared_ptr<Store> makeFileStore(const std::string& directory) {
  return std::make_shared<FileStore>(directory);
}

}  // namespace kolo::comm
