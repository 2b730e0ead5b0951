// FailureWatch (failure_watch.h): its thread parks a get-available of the failure key at the
// store, renews it each minute, and tells the launcher's poll loop through a pipe.
#include "launch/failure_watch.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kolo/error.h"

namespace kolo::parallel::detail {
namespace {

// How long one parked request waits before it is renewed: a request a minute a host.
constexpr std::chrono::milliseconds kParkFor = std::chrono::minutes(1);

}  // namespace

FailureWatch::FailureWatch(const std::string& address, const std::string& token, std::string key,
                           std::chrono::milliseconds connectTimeout)
    : client_(std::static_pointer_cast<comm::TcpStoreClient>(comm::connectTcpStore(address, token, connectTimeout))),
      key_(std::move(key)) {
  if (::pipe2(pipe_, O_CLOEXEC | O_NONBLOCK) != 0)
    KOLO_THROW(IoError, "kolo run: cannot create the failure watch's pipe: ", std::strerror(errno));
  thread_ = std::thread([this] { run(); });
}

FailureWatch::~FailureWatch() {
  stopping_ = true;
  client_->interrupt();
  thread_.join();
  ::close(pipe_[0]);
  ::close(pipe_[1]);
}

std::optional<FailureWatch::News> FailureWatch::news() {
  std::lock_guard<std::mutex> lock(mutex_);
  return news_;
}

void FailureWatch::tell(News news) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    news_ = std::move(news);
  }
  const char byte = 1;
  [[maybe_unused]] const ssize_t n = ::write(pipe_[1], &byte, 1);
}

void FailureWatch::run() {
  try {
    for (;;) {
      const auto got = client_->getAvailable({key_}, kParkFor);
      if (got[0]) {
        tell({std::string(got[0]->begin(), got[0]->end()), false});
        return;
      }
    }
  } catch (const Error& e) {
    if (!stopping_) tell({std::string("lost the store: ") + e.what(), true});
  }
}

}  // namespace kolo::parallel::detail
