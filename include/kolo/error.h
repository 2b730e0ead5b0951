// kolo's exception hierarchy and the KOLO_CHECK family of macros.
// Every layer reports failures by throwing a subclass of kolo::Error whose message names
// what was wrong and where (file, rank, peer, value); library code never exits or aborts.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kolo {

/// Base of every exception kolo throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

/// A caller passed a value that cannot be used (wrong shape, unknown option, bad rank...).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// An operating-system or peer failure: a file or socket error, a peer that vanished.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A deadline passed before the awaited event (a collective, a store key, a peer) arrived.
class Timeout : public Error {
 public:
  using Error::Error;
};

/// Ranks disagreed about a collective (operation, dtype, count, root or sequence number).
class Mismatch : public Error {
 public:
  using Error::Error;
};

/// Bytes on disk or on the wire do not follow the expected format (corrupt, truncated).
class FormatError : public Error {
 public:
  using Error::Error;
};

namespace detail {

template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace detail
}  // namespace kolo

/// Throws ExceptionType with the message built by streaming every argument.
#define KOLO_THROW(ExceptionType, ...) throw ExceptionType(::kolo::detail::concat(__VA_ARGS__))

/// Throws kolo::InvalidArgument unless `cond` holds; extra arguments are appended to the message.
#define KOLO_CHECK(cond, ...)                                                          \
  do {                                                                                 \
    if (!(cond))                                                                       \
      KOLO_THROW(::kolo::InvalidArgument, "check failed: " #cond " (" __FILE__ ":", __LINE__, \
                 ") " __VA_OPT__(, ) __VA_ARGS__);                                     \
  } while (0)

#define KOLO_CHECK_OP_(a, b, op, ...)                                                       \
  do {                                                                                      \
    const auto& kolo_lhs_ = (a);                                                            \
    const auto& kolo_rhs_ = (b);                                                            \
    if (!(kolo_lhs_ op kolo_rhs_))                                                          \
      KOLO_THROW(::kolo::InvalidArgument, "check failed: " #a " " #op " " #b " (", kolo_lhs_, \
                 " vs ", kolo_rhs_, ") at " __FILE__ ":", __LINE__, " " __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

/// Comparison checks that print both sides: KOLO_CHECK_EQ(x.size(), 3, "while reading ", path).
#define KOLO_CHECK_EQ(a, b, ...) KOLO_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define KOLO_CHECK_NE(a, b, ...) KOLO_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define KOLO_CHECK_LT(a, b, ...) KOLO_CHECK_OP_(a, b, <, __VA_ARGS__)
#define KOLO_CHECK_LE(a, b, ...) KOLO_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define KOLO_CHECK_GT(a, b, ...) KOLO_CHECK_OP_(a, b, >, __VA_ARGS__)
#define KOLO_CHECK_GE(a, b, ...) KOLO_CHECK_OP_(a, b, >=, __VA_ARGS__)
