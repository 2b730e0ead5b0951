// Header, error and hello exchanges of the parameter-server wire format (wire.h).
#include "parallel/ps/wire.h"

#include <vector>

#include "kolo/error.h"
#include "parallel/ps/compress.h"

namespace kolo::parallel::ps::detail {

Header recvHeader(Socket& socket, Clock::time_point deadline, const char* what) {
  Header h;
  socket.recvAll(&h, sizeof h, deadline, what);
  if (h.magic != kMagic)
    KOLO_THROW(FormatError, socket.peer(), " sent a message that is not kolo's parameter-server ",
               "protocol (magic ", h.magic, ")");
  return h;
}

float* recvGradients(Socket& socket, const Header& request, bool fp16, bool bf16,
                     int64_t elements, std::vector<uint16_t>& packed,
                     std::vector<float>& gradient, Clock::time_point deadline) {
  gradient.resize(static_cast<size_t>(elements));
  if (bf16) packed.resize(static_cast<size_t>(elements));
  if (fp16) {
    if (request.b < -120 || request.b > 120)
      KOLO_THROW(FormatError, socket.peer(), " pushed fp16 gradients scaled by 2^", request.b);
    socket.recvAll(packed.data(), request.payload, deadline, "the gradients");
    unpackHalf(packed.data(), gradient.data(), packed.size(), static_cast<int>(request.b));
  } else if (bf16) {
    socket.recvAll(packed.data(), request.payload, deadline, "the gradients");
    unpackBf16(packed.data(), gradient.data(), packed.size());
  } else {
    socket.recvAll(gradient.data(), request.payload, deadline, "the gradients");
  }
  return gradient.data();
}

void sendError(Socket& socket, const std::string& message, Clock::time_point deadline) {
  const std::string text = message.substr(0, kMaxTextBytes);
  const Header h = reply(Status::Error, 0, 0, text.size());
  iovec parts[2] = {{const_cast<Header*>(&h), sizeof h},
                    {const_cast<char*>(text.data()), text.size()}};
  try {
    socket.sendAll(parts, 2, deadline, "an error reply");
  } catch (const Error&) {
  }
}

void throwRemoteError(Socket& socket, const Header& h, Clock::time_point deadline) {
  if (h.payload > kMaxTextBytes)
    KOLO_THROW(FormatError, socket.peer(), " sent an error message of ", h.payload, " bytes");
  std::string text(h.payload, '\0');
  socket.recvAll(text.data(), text.size(), deadline, "an error message");
  KOLO_THROW(PeerError, socket.peer(), " reported: ", text);
}

Header hello(Socket& socket, uint32_t index, int64_t role, const std::string& token,
             Clock::time_point deadline, uint32_t flags) {
  Header h = request(Op::Hello, role, 0, token.size());
  h.index = index;
  h.flags = flags;
  iovec parts[2] = {{&h, sizeof h}, {const_cast<char*>(token.data()), token.size()}};
  socket.sendAll(parts, 2, deadline, "the hello");
  const Header answer = recvHeader(socket, deadline, "the reply to the hello");
  if (answer.op == static_cast<uint32_t>(Status::Error)) throwRemoteError(socket, answer, deadline);
  if (answer.op != static_cast<uint32_t>(Status::Ok) || answer.payload != 0)
    KOLO_THROW(FormatError, socket.peer(), " answered the hello with status ", answer.op);
  return answer;
}

Header acceptHello(Socket& socket, const std::string& token, Clock::time_point deadline) {
  const Header h = recvHeader(socket, deadline, "a hello");
  if (h.op != static_cast<uint32_t>(Op::Hello) || h.payload > kMaxTokenBytes)
    KOLO_THROW(FormatError, socket.peer(), " did not start with a hello");
  std::string presented(h.payload, '\0');
  socket.recvAll(presented.data(), presented.size(), deadline, "the token");
  if (presented != token) {
    sendError(socket, "wrong job token", deadline);
    KOLO_THROW(PeerError, socket.peer(), " presented a wrong job token");
  }
  return h;
}

void checkServerRequest(const Header& request, uint64_t pushBytes, const std::string& peer,
                        const std::string& server) {
  switch (static_cast<Op>(request.op)) {
    case Op::Push:
      if (request.payload != pushBytes)
        KOLO_THROW(FormatError, peer, " pushed ", request.payload, " bytes to ", server,
                   ", which takes ", pushBytes);
      return;
    case Op::Checkpoint:
    case Op::Restore:
      if (request.payload > kMaxTextBytes)
        KOLO_THROW(FormatError, peer, " sent a checkpoint path of ", request.payload, " bytes to ",
                   server);
      return;
    case Op::Share:
      if (request.payload < sizeof(uint64_t) || request.payload > sizeof(uint64_t) + kMaxTextBytes)
        KOLO_THROW(FormatError, peer, " sent a share request of ", request.payload, " bytes to ",
                   server);
      return;
    case Op::Pull:
    case Op::Leave:
    case Op::Stats:
    case Op::Drop:
    case Op::Shutdown:
      if (request.payload != 0)
        KOLO_THROW(FormatError, peer, " sent ", request.payload, " bytes with request ", request.op,
                   " to ", server);
      return;
    default:
      KOLO_THROW(FormatError, peer, " sent unknown request ", request.op, " to ", server);
  }
}

int64_t stalenessOf(int64_t version, int64_t basis, const std::string& peer,
                    const std::string& server) {
  if (basis < 0 || basis > version)
    KOLO_THROW(FormatError, peer, " pushed gradients computed on version ", basis, " to ", server,
               ", which is at version ", version);
  return version - basis;
}

void checkUnitRequest(const Header& request, int64_t held, int64_t unitSamples,
                      const std::string& peer) {
  if (request.op != static_cast<uint32_t>(Op::Next) || request.payload != sizeof(double))
    KOLO_THROW(FormatError, peer, " sent request ", request.op, " with ", request.payload,
               " bytes to the chief, which serves unit requests only");
  if (request.a == -1) return;
  if (request.a < 0 || request.a != held)
    KOLO_THROW(FormatError, peer, " reported unit ", request.a, " done, but it holds ",
               held < 0 ? std::string("none") : "unit " + std::to_string(held));
  if (request.b < 0 || request.b > unitSamples)
    KOLO_THROW(FormatError, peer, " reported ", request.b, " batches for unit ", request.a,
               ", which has at most ", unitSamples, " samples");
}

void checkUnitReply(const Header& answer, const int64_t range[2], const std::string& peer) {
  if (answer.a < 0 || answer.b < 0 || range[0] < 0 || range[1] < range[0])
    KOLO_THROW(FormatError, peer, " handed out unit ", answer.a, " of epoch ", answer.b,
               " with samples [", range[0], ", ", range[1], ")");
}

}  // namespace kolo::parallel::ps::detail
