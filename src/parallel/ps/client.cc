// The workers' and the chief's side of the servers: one socket per server. A step sends the
// request to every server before reading any reply, so the servers receive, update and answer
// in parallel; gradients leave from the .grad() tensors and values land in the parameters,
// slice by slice, without a staging copy over TCP. With the server on this host they go
// through shared memory: gradients computed in the connection's segment (placeGradients) or
// copied there, sync values copied straight out of the server's own memory.
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "kolo/error.h"
#include "kolo/parallel/parameter_server.h"
#include "kolo/trace.h"
#include "parallel/ps/compress.h"
#include "parallel/ps/shared_exchange.h"
#include "parallel/ps/socket.h"
#include "parallel/ps/wire.h"

namespace kolo::parallel::ps {

using detail::Header;
using detail::Op;
using detail::Socket;
using detail::Status;

class ServerGroup::Impl {
 public:
  Impl(ClientOptions options, Placement placement, std::vector<std::string> addresses)
      : options_(std::move(options)), placement_(std::move(placement)) {
    KOLO_CHECK_EQ(addresses.size(), static_cast<size_t>(placement_.servers),
                  "one address per server");
    const auto until = detail::deadlineAfter(options_.timeout);
    for (int s = 0; s < placement_.servers; ++s) {
      const std::string peer =
          "parameter server " + std::to_string(s) + " (" + addresses[static_cast<size_t>(s)] + ")";
      Socket socket = detail::connectTo(addresses[static_cast<size_t>(s)], until, peer);
      const Header answer = detail::hello(socket, static_cast<uint32_t>(options_.index),
                                          static_cast<int64_t>(options_.role), options_.token,
                                          until, static_cast<uint32_t>(options_.compression));
      if (answer.b != placement_.elementsOf(s))
        KOLO_THROW(Mismatch, peer, " holds ", answer.b, " elements, but this process places ",
                   placement_.elementsOf(s),
                   " there: the processes disagree about the model or "
                   "ParameterServerOptions::shardBytes");
      shared_.emplace_back();
      serverValues_.emplace_back();
      if (options_.sharedMemory && !compressed()) offerSharedMemory(socket, s, until);
      sockets_.push_back(std::move(socket));
      slices_.push_back(placement_.slicesOf(s));
      if (compressed()) packed_.emplace_back(static_cast<size_t>(placement_.elementsOf(s)));
    }
  }

  int64_t pull(const NamedTensors& parameters) {
    const auto until = detail::deadlineAfter(options_.timeout);
    for (size_t s = 0; s < sockets_.size(); ++s) {
      Header h = detail::request(Op::Pull);
      // A worker reads a sync server's values in place (and is back in its rounds).
      if (readsValuesInPlace(s)) h.flags = detail::kReadsSharedValues;
      sockets_[s].sendAll(&h, sizeof h, until, "a pull request");
    }
    return receiveValues(parameters, until);
  }

  int64_t pushPull(const NamedTensors& parameters, int64_t basedOn) {
    const auto until = detail::deadlineAfter(options_.timeout);
    std::vector<iovec> parts;
    for (size_t s = 0; s < sockets_.size(); ++s) {
      const int64_t elements = placement_.elementsOf(static_cast<int>(s));
      // fp16: one power-of-two scale for the whole message, from its largest gradient.
      int exponent = 0;
      if (options_.compression == Compression::Fp16) {
        float largest = 0.0f;
        for (const Slice& slice : slices_[s])
          largest = std::max(largest, detail::maxAbs(gradientOf(parameters, slice).data<float>() +
                                                         slice.begin,
                                                     static_cast<size_t>(slice.size())));
        exponent = detail::halfExponent(largest);
      }
      headers_.resize(sockets_.size());
      if (shared_[s]) {
        // The gradients go into the segment (unless placed there) before the header says they
        // are there.
        float* to = shared_[s]->gradients();
        for (const Slice& slice : slices_[s]) {
          const float* from = gradientOf(parameters, slice).data<float>() + slice.begin;
          if (from != to) std::memcpy(to, from, static_cast<size_t>(slice.size()) * 4);
          to += slice.size();
        }
        headers_[s] = detail::request(Op::Push, basedOn);
        if (readsValuesInPlace(s)) headers_[s].flags = detail::kReadsSharedValues;
        sockets_[s].sendAll(&headers_[s], sizeof(Header), until, "the gradients");
        continue;
      }
      headers_[s] = detail::request(Op::Push, basedOn, exponent,
                                    static_cast<uint64_t>(elements) * elementBytes());
      parts.clear();
      parts.push_back({&headers_[s], sizeof(Header)});
      int64_t at = 0;
      for (const Slice& slice : slices_[s]) {
        Tensor grad = gradientOf(parameters, slice);
        if (options_.compression == Compression::Fp16) {
          detail::packHalf(grad.data<float>() + slice.begin, packed_[s].data() + at,
                           static_cast<size_t>(slice.size()), exponent);
        } else if (compressed()) {
          detail::packBf16(grad.data<float>() + slice.begin, packed_[s].data() + at,
                           static_cast<size_t>(slice.size()));
        } else {
          parts.push_back(
              {grad.data<float>() + slice.begin, static_cast<size_t>(slice.size()) * 4});
        }
        at += slice.size();
      }
      if (compressed()) parts.push_back({packed_[s].data(), packed_[s].size() * 2});
      sockets_[s].sendAll(parts.data(), static_cast<int>(parts.size()), until, "the gradients");
    }
    return receiveValues(parameters, until);
  }

  void leave() { simple(Op::Leave, "a leave request", false); }

  std::vector<ServerStats> stats() {
    const auto until = detail::deadlineAfter(options_.timeout);
    std::vector<ServerStats> all;
    for (Socket& socket : sockets_) {
      const Header h = detail::request(Op::Stats);
      socket.sendAll(&h, sizeof h, until, "a statistics request");
      const Header answer = expectOk(socket, until, "the statistics");
      int64_t fields[10] = {};
      if (answer.payload != sizeof fields)
        KOLO_THROW(FormatError, socket.peer(), " sent ", answer.payload, " bytes of statistics");
      socket.recvAll(fields, sizeof fields, until, "the statistics");
      all.push_back({fields[0], fields[1], fields[2], fields[3], fields[4], fields[5], fields[6],
                     fields[7], fields[8], fields[9]});
    }
    return all;
  }

  void shutdown() { simple(Op::Shutdown, "a shutdown request", true); }

  void drop(int worker) {
    const auto until = detail::deadlineAfter(options_.timeout);
    for (Socket& socket : sockets_) {
      Header h = detail::request(Op::Drop);
      h.index = static_cast<uint32_t>(worker);
      socket.sendAll(&h, sizeof h, until, "a drop request");
      expectOk(socket, until, "the drop reply");
    }
  }

  void checkpoint(const std::string& directory) {
    const auto until = detail::deadlineAfter(options_.timeout);
    for (size_t s = 0; s < sockets_.size(); ++s) {
      const std::string path = directory + "/server-" + std::to_string(s) + ".safetensors";
      const Header h = detail::request(Op::Checkpoint, 0, 0, path.size());
      iovec parts[2] = {{const_cast<Header*>(&h), sizeof h},
                        {const_cast<char*>(path.data()), path.size()}};
      sockets_[s].sendAll(parts, 2, until, "a checkpoint request");
    }
    for (Socket& socket : sockets_) expectOk(socket, until, "the checkpoint reply");
  }

  void restore(const std::string& directory) {
    const auto until = detail::deadlineAfter(options_.timeout);
    for (size_t s = 0; s < sockets_.size(); ++s) {
      const std::string path = directory + "/server-" + std::to_string(s) + ".safetensors";
      const Header h = detail::request(Op::Restore, 0, 0, path.size());
      iovec parts[2] = {{const_cast<Header*>(&h), sizeof h},
                        {const_cast<char*>(path.data()), path.size()}};
      sockets_[s].sendAll(parts, 2, until, "a restore request");
    }
    for (Socket& socket : sockets_) expectOk(socket, until, "the restore reply");
  }

  const Placement& placement() const { return placement_; }

  int sharedServers() const {
    return static_cast<int>(
        std::count_if(shared_.begin(), shared_.end(), [](const auto& e) { return e != nullptr; }));
  }

  int sharedValueServers() const {
    return static_cast<int>(std::count_if(serverValues_.begin(), serverValues_.end(),
                                          [](const auto& v) { return v != nullptr; }));
  }

  int placeValues(const NamedTensors& parameters) {
    if (options_.role != ClientRole::Worker) return 0;
    int placed = 0;
    for (size_t s = 0; s < serverValues_.size(); ++s) {
      if (!serverValues_[s]) continue;
      float* at = serverValues_[s]->values();
      for (const Slice& slice : slices_[s]) {
        Tensor parameter = parameters[static_cast<size_t>(slice.parameter)].second;
        if (slice.begin == 0 && slice.end == parameter.numel()) {
          detail::useStorageOf(parameter, detail::tensorOver(serverValues_[s], at, parameter.shape()));
          ++placed;
        }
        at += slice.size();
      }
    }
    return placed;
  }

  int placeGradients(const NamedTensors& parameters) {
    int placed = 0;
    for (size_t s = 0; s < shared_.size(); ++s) {
      if (!shared_[s]) continue;
      float* at = shared_[s]->gradients();
      for (const Slice& slice : slices_[s]) {
        Tensor parameter = parameters[static_cast<size_t>(slice.parameter)].second;
        if (slice.begin == 0 && slice.end == parameter.numel()) {
          Tensor gradient = detail::tensorOver(shared_[s], at, parameter.shape());
          const Tensor current = parameter.grad();
          if (current.defined()) gradient.copyFrom(current);
          parameter.setGrad(gradient);
          ++placed;
        }
        at += slice.size();
      }
    }
    return placed;
  }

 private:
  /// Offers server `server` (connected on `socket`) a shared-memory segment and keeps it in
  /// shared_ when the server mapped it, with the server's own values in serverValues_ when it
  /// offers them and they can be mapped. A server on another host, or one that could not map
  /// the segment (or no shared memory to spare here), leaves the connection on TCP.
  void offerSharedMemory(Socket& socket, int server, detail::Clock::time_point until) {
    const size_t s = static_cast<size_t>(server);
    const int64_t elements = placement_.elementsOf(server);
    detail::SharedExchange exchange;
    try {
      exchange = detail::SharedExchange::create(
          elements, "kolo-ps-" + std::to_string(options_.index) + "-to-" + std::to_string(server));
    } catch (const IoError&) {
      return;
    }
    const std::string hostId = comm::detail::machineHostId();
    std::string offer(sizeof(uint64_t), '\0');
    const uint64_t cookie = exchange.cookie();
    std::memcpy(offer.data(), &cookie, sizeof cookie);
    offer += hostId;
    const Header h = detail::request(Op::Share, ::getpid(), exchange.fd(), offer.size());
    iovec parts[2] = {{const_cast<Header*>(&h), sizeof h}, {offer.data(), offer.size()}};
    socket.sendAll(parts, 2, until, "the shared-memory offer");
    const Header answer = expectOk(socket, until, "the reply to the shared-memory offer");
    // Mapped or not, the server has answered: the descriptor is no longer needed.
    exchange.closeFd();
    if (answer.payload != 0 && (answer.a != 1 || answer.payload != sizeof(detail::ValuesOffer)))
      KOLO_THROW(FormatError, socket.peer(), " answered a shared-memory offer with ",
                 answer.payload, " bytes");
    detail::ValuesOffer values;
    if (answer.payload != 0) socket.recvAll(&values, sizeof values, until, "the values offer");
    if (answer.a != 1) return;
    shared_[s] = std::make_shared<detail::SharedExchange>(std::move(exchange));
    if (answer.payload == 0) return;
    try {
      serverValues_[s] = std::make_shared<detail::SharedValues>(detail::SharedValues::map(
          static_cast<int>(values.pid), static_cast<int>(values.fd), elements, values.cookie));
    } catch (const Error&) {
      // The server's values stay out of reach (its process seen through another pid
      // namespace, say): its replies come through the segment.
    }
  }

  static Tensor gradientOf(const NamedTensors& parameters, const Slice& slice) {
    Tensor grad = parameters[static_cast<size_t>(slice.parameter)].second.grad();
    const std::string& name = parameters[static_cast<size_t>(slice.parameter)].first;
    KOLO_REQUIRE(grad.defined(), "parameter ", name,
                 " has no gradient to push: the loss does not depend on it (is it in a layer "
                 "forward does not reach?)");
    KOLO_CHECK(grad.isContiguous(), "parameter ", name, " has no contiguous gradient to push");
    return grad;
  }

  Header expectOk(Socket& socket, detail::Clock::time_point until, const char* what) {
    const Header answer = detail::recvHeader(socket, until, what);
    if (answer.op == static_cast<uint32_t>(Status::Error))
      detail::throwRemoteError(socket, answer, until);
    if (answer.op != static_cast<uint32_t>(Status::Ok))
      KOLO_THROW(FormatError, socket.peer(), " answered with status ", answer.op);
    return answer;
  }

  void simple(Op op, const char* what, bool tolerateGone) {
    const auto until = detail::deadlineAfter(options_.timeout);
    for (Socket& socket : sockets_) {
      try {
        const Header h = detail::request(op);
        socket.sendAll(&h, sizeof h, until, what);
        expectOk(socket, until, what);
      } catch (const PeerError&) {
        if (!tolerateGone) throw;
      }
    }
  }

  /// Reads every server's values into the parameters; returns the lowest version.
  int64_t receiveValues(const NamedTensors& parameters, detail::Clock::time_point until) {
    int64_t version = INT64_MAX;
    for (size_t s = 0; s < sockets_.size(); ++s) {
      Socket& socket = sockets_[s];
      const Header answer = expectOk(socket, until, "the parameters");
      const int64_t elements = placement_.elementsOf(static_cast<int>(s));
      if (shared_[s]) {
        if (answer.payload != 0)
          KOLO_THROW(FormatError, socket.peer(), " sent ", answer.payload,
                     " bytes of parameters on a connection that shares memory");
        if (answer.b != 0 && (answer.b != 1 || !readsValuesInPlace(s)))
          KOLO_THROW(FormatError, socket.peer(), " put its values in place ", answer.b,
                     " on a connection that cannot read them there");
        copySharedValues(parameters, s,
                         answer.b == 1 ? serverValues_[s]->values() : shared_[s]->values());
        version = std::min(version, answer.a);
        continue;
      }
      if (answer.payload != static_cast<uint64_t>(elements) * elementBytes())
        KOLO_THROW(FormatError, socket.peer(), " sent ", answer.payload,
                   " bytes of parameters instead of ", elements * elementBytes());
      if (compressed())
        socket.recvAll(packed_[s].data(), packed_[s].size() * 2, until, "the parameters");
      const bool half = options_.compression == Compression::Fp16;
      if (half && (answer.b < -120 || answer.b > 120))
        KOLO_THROW(FormatError, socket.peer(), " sent fp16 values scaled by 2^", answer.b);
      int64_t at = 0;
      for (const Slice& slice : slices_[s]) {
        Tensor target = parameters[static_cast<size_t>(slice.parameter)].second;
        if (half) {
          detail::unpackHalf(packed_[s].data() + at, target.data<float>() + slice.begin,
                             static_cast<size_t>(slice.size()), static_cast<int>(answer.b));
        } else if (compressed()) {
          detail::unpackBf16(packed_[s].data() + at, target.data<float>() + slice.begin,
                             static_cast<size_t>(slice.size()));
        } else {
          socket.recvAll(target.data<float>() + slice.begin, static_cast<size_t>(slice.size()) * 4,
                         until, "the parameters");
        }
        at += slice.size();
      }
      version = std::min(version, answer.a);
    }
    return version;
  }

  /// Copies the values of server `s` from `from` (its own memory or the segment) into the
  /// parameters, slice by slice.
  /// (A parameter placed in the server's values is there already.)
  void copySharedValues(const NamedTensors& parameters, size_t s, const float* from) {
    for (const Slice& slice : slices_[s]) {
      Tensor target = parameters[static_cast<size_t>(slice.parameter)].second;
      float* to = target.data<float>() + slice.begin;
      if (to != from) std::memcpy(to, from, static_cast<size_t>(slice.size()) * 4);
      from += slice.size();
    }
  }

  /// Whether this worker reads server `s`'s values in place (the chief never does: it pulls
  /// while the workers' rounds go on).
  bool readsValuesInPlace(size_t s) const {
    return serverValues_[s] != nullptr && options_.role == ClientRole::Worker;
  }

  bool compressed() const { return options_.compression != Compression::None; }
  int64_t elementBytes() const { return compressed() ? 2 : 4; }

  ClientOptions options_;
  Placement placement_;
  std::vector<std::vector<uint16_t>> packed_;  // bf16/fp16: one message per server
  std::vector<Socket> sockets_;
  // Per server: its connection's segment (null: TCP), and its own values when mapped. The
  // segments are shared with the gradient tensors placed in them (placeGradients).
  std::vector<std::shared_ptr<detail::SharedExchange>> shared_;
  std::vector<std::shared_ptr<detail::SharedValues>> serverValues_;
  std::vector<std::vector<Slice>> slices_;
  std::vector<Header> headers_;
};

ServerGroup::ServerGroup(ClientOptions options, Placement placement,
                         std::vector<std::string> addresses)
    : impl_(
          std::make_unique<Impl>(std::move(options), std::move(placement), std::move(addresses))) {}
ServerGroup::~ServerGroup() = default;
ServerGroup::ServerGroup(ServerGroup&&) noexcept = default;
ServerGroup& ServerGroup::operator=(ServerGroup&&) noexcept = default;
int64_t ServerGroup::pull(const NamedTensors& parameters) {
  trace::Scope span("ps pull", "ps");
  return impl_->pull(parameters);
}
int64_t ServerGroup::pushPull(const NamedTensors& parameters, int64_t basedOn) {
  trace::Scope span("ps push+pull", "ps");
  span.index(basedOn);
  return impl_->pushPull(parameters, basedOn);
}
void ServerGroup::leave() { impl_->leave(); }
std::vector<ServerStats> ServerGroup::stats() { return impl_->stats(); }
void ServerGroup::shutdown() { impl_->shutdown(); }
void ServerGroup::drop(int worker) { impl_->drop(worker); }
void ServerGroup::checkpoint(const std::string& directory) { impl_->checkpoint(directory); }
void ServerGroup::restore(const std::string& directory) { impl_->restore(directory); }
const Placement& ServerGroup::placement() const { return impl_->placement(); }
int ServerGroup::sharedServers() const { return impl_->sharedServers(); }
int ServerGroup::sharedValueServers() const { return impl_->sharedValueServers(); }
int ServerGroup::placeGradients(const NamedTensors& parameters) {
  return impl_->placeGradients(parameters);
}
int ServerGroup::placeValues(const NamedTensors& parameters) {
  return impl_->placeValues(parameters);
}

}  // namespace kolo::parallel::ps
