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

}  // namespace kolo::parallel::ps::detail
