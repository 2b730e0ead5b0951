// A parameter-server connection's shared-memory segment (shared_exchange.h).
#include "parallel/ps/shared_exchange.h"

#include <cstring>
#include <random>

#include "kolo/error.h"

namespace kolo::parallel::ps::detail {
namespace {

// The gradients start a page in, so both arrays are page-aligned for the copies.
constexpr size_t kHeaderBytes = 4096;

}  // namespace

size_t SharedExchange::bytesFor(int64_t elements) {
  return kHeaderBytes + 2 * static_cast<size_t>(elements) * sizeof(float);
}

SharedExchange SharedExchange::create(int64_t elements, const std::string& label) {
  SharedExchange exchange;
  exchange.file_ = comm::detail::ShmFile::create(label, bytesFor(elements));
  exchange.elements_ = elements;
  std::random_device entropy;
  const uint64_t cookie = (static_cast<uint64_t>(entropy()) << 32) | entropy();
  std::memcpy(exchange.file_.data(), &cookie, sizeof cookie);
  return exchange;
}

SharedExchange SharedExchange::map(int pid, int fd, int64_t elements, uint64_t cookie) {
  SharedExchange exchange;
  exchange.file_ = comm::detail::ShmFile::openPeer(pid, fd, bytesFor(elements));
  exchange.elements_ = elements;
  if (exchange.cookie() != cookie)
    KOLO_THROW(Mismatch, "the shared memory of process ", pid, " (descriptor ", fd,
               ") is not the segment its connection offered (another cookie)");
  return exchange;
}

float* SharedExchange::gradients() const {
  return reinterpret_cast<float*>(static_cast<char*>(file_.data()) + kHeaderBytes);
}

float* SharedExchange::values() const { return gradients() + elements_; }

uint64_t SharedExchange::cookie() const {
  uint64_t cookie = 0;
  std::memcpy(&cookie, file_.data(), sizeof cookie);
  return cookie;
}

}  // namespace kolo::parallel::ps::detail
