// A parameter-server connection's shared-memory segment (shared_exchange.h).
#include "parallel/ps/shared_exchange.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "kolo/error.h"

namespace kolo::parallel::ps::detail {
namespace {

// The gradients start a page in, so both arrays are page-aligned for the copies.
constexpr size_t kHeaderBytes = 4096;

uint64_t randomCookie() {
  std::random_device entropy;
  return (static_cast<uint64_t>(entropy()) << 32) | entropy();
}

uint64_t cookieAt(const comm::detail::ShmFile& file) {
  uint64_t cookie = 0;
  std::memcpy(&cookie, file.data(), sizeof cookie);
  return cookie;
}

void checkCookie(uint64_t found, uint64_t expected, int pid, int fd) {
  if (found != expected)
    KOLO_THROW(Mismatch, "the shared memory of process ", pid, " (descriptor ", fd,
               ") is not the segment its connection offered (another cookie)");
}

}  // namespace

size_t SharedExchange::bytesFor(int64_t elements) {
  return kHeaderBytes + 2 * static_cast<size_t>(elements) * sizeof(float);
}

SharedExchange SharedExchange::create(int64_t elements, const std::string& label) {
  SharedExchange exchange;
  exchange.file_ = comm::detail::ShmFile::create(label, bytesFor(elements));
  exchange.elements_ = elements;
  const uint64_t cookie = randomCookie();
  std::memcpy(exchange.file_.data(), &cookie, sizeof cookie);
  return exchange;
}

SharedExchange SharedExchange::map(int pid, int fd, int64_t elements, uint64_t cookie) {
  SharedExchange exchange;
  exchange.file_ = comm::detail::ShmFile::openPeer(pid, fd, bytesFor(elements));
  exchange.elements_ = elements;
  checkCookie(exchange.cookie(), cookie, pid, fd);
  return exchange;
}

float* SharedExchange::gradients() const {
  return reinterpret_cast<float*>(static_cast<char*>(file_.data()) + kHeaderBytes);
}

float* SharedExchange::values() const { return gradients() + elements_; }

uint64_t SharedExchange::cookie() const { return cookieAt(file_); }

SharedValues SharedValues::create(int64_t elements, const std::string& label) {
  SharedValues shared;
  shared.file_ = comm::detail::ShmFile::create(
      label, kHeaderBytes + static_cast<size_t>(elements) * sizeof(float));
  const uint64_t cookie = randomCookie();
  std::memcpy(shared.file_.data(), &cookie, sizeof cookie);
  return shared;
}

SharedValues SharedValues::map(int pid, int fd, int64_t elements, uint64_t cookie) {
  SharedValues shared;
  shared.file_ = comm::detail::ShmFile::openPeer(
      pid, fd, kHeaderBytes + static_cast<size_t>(elements) * sizeof(float));
  checkCookie(shared.cookie(), cookie, pid, fd);
  if (::mprotect(shared.file_.data(), shared.file_.bytes(), PROT_READ) != 0)
    KOLO_THROW(IoError, "cannot make the values of process ", pid, " read-only: ",
               std::strerror(errno));
  return shared;
}

float* SharedValues::values() const {
  return reinterpret_cast<float*>(static_cast<char*>(file_.data()) + kHeaderBytes);
}

uint64_t SharedValues::cookie() const { return cookieAt(file_); }

void useStorageOf(const Tensor& parameter, const Tensor& over) {
  KOLO_CHECK(parameter.shape() == over.shape() && parameter.dtype() == over.dtype(),
             "a parameter of shape ", shapeString(parameter.shape()),
             " cannot use the storage of a tensor of shape ", shapeString(over.shape()));
  TensorImpl& impl = *parameter.impl();
  impl.storage = over.impl()->storage;
  impl.offset = over.impl()->offset;
  impl.strides = over.impl()->strides;
}

Tensor serverValues(int64_t elements, const std::string& label,
                    std::shared_ptr<SharedValues>* file) {
  if (file == nullptr) return Tensor::zeros({elements});
  try {
    *file = std::make_shared<SharedValues>(SharedValues::create(elements, label));
  } catch (const IoError&) {
    file->reset();
    return Tensor::zeros({elements});
  }
  // A new file reads as zeros.
  return tensorOver(*file, (*file)->values(), {elements});
}

SharedExchange acceptOffer(Socket& socket, const Header& request, const std::string& hostId,
                           int64_t elements, bool packed, Clock::time_point deadline) {
  if (request.payload < sizeof(uint64_t) || request.payload > sizeof(uint64_t) + kMaxTextBytes)
    KOLO_THROW(FormatError, socket.peer(), " sent a share request of ", request.payload,
               " bytes");
  std::string offer(request.payload, '\0');
  socket.recvAll(offer.data(), offer.size(), deadline, "the share request");
  uint64_t cookie = 0;
  std::memcpy(&cookie, offer.data(), sizeof cookie);
  if (packed || offer.substr(sizeof cookie) != hostId) return {};
  try {
    // A peer that can be mapped is a process of this user on this host: it could as well
    // attach to this process, so its segment is no less trusted than this memory.
    return SharedExchange::map(static_cast<int>(request.a), static_cast<int>(request.b), elements,
                               cookie);
  } catch (const Error&) {
    return {};  // another pid namespace, /proc not readable, the process gone: TCP
  }
}

void answerOffer(Socket& socket, bool shared, const SharedValues* values,
                 Clock::time_point deadline) {
  const bool offered = shared && values != nullptr;
  ValuesOffer offer;
  if (offered) offer = {::getpid(), values->fd(), values->cookie()};
  const Header ok = reply(Status::Ok, shared ? 1 : 0, 0, offered ? sizeof offer : 0);
  iovec parts[2] = {{const_cast<Header*>(&ok), sizeof ok}, {&offer, sizeof offer}};
  socket.sendAll(parts, offered ? 2 : 1, deadline, "the share reply");
}

Tensor tensorOver(std::shared_ptr<const void> owner, float* data, const Shape& shape) {
  auto storage = std::make_shared<Storage>();
  storage->bytes =
      std::shared_ptr<uint8_t[]>(reinterpret_cast<uint8_t*>(data), [owner](uint8_t*) {});
  storage->nbytes = static_cast<size_t>(shapeNumel(shape)) * sizeof(float);
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguousStrides(shape);
  impl->dtype = DType::F32;
  return Tensor(std::move(impl));
}

}  // namespace kolo::parallel::ps::detail
