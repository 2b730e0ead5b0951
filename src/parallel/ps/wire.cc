// Header, error and hello exchanges of the parameter-server wire format (wire.h).
#include "parallel/ps/wire.h"

#include <vector>

#include "kolo/error.h"

namespace kolo::parallel::ps::detail {

Header recvHeader(Socket& socket, Clock::time_point deadline, const char* what) {
  Header h;
  socket.recvAll(&h, sizeof h, deadline, what);
  if (h.magic != kMagic)
    KOLO_THROW(FormatError, socket.peer(), " sent a message that is not kolo's parameter-server ",
               "protocol (magic ", h.magic, ")");
  return h;
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
