// kolo's exception hierarchy and the macros that throw: KOLO_REQUIRE for a user's mistake
// (the message alone), KOLO_CHECK for an invariant (adds the expression and source line).
// Every layer reports failures by throwing a subclass of kolo::Error whose message names
// what was wrong and where (file, rank, peer, value); library code never exits or aborts.
// The `kolo` program maps each kind to an exit code (docs/exit_codes.md).
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

/// A failed internal check (KOLO_CHECK*): an invariant of kolo, or a library caller's
/// contract, did not hold; the message names the expression and src/FILE:LINE. A kind of
/// InvalidArgument, so that callers that catch a broken contract as InvalidArgument (as the
/// public headers document it) keep working; the `kolo` program reports it as an internal
/// error (exit code 8), never as a flag that is not accepted.
class InternalError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

/// An operating-system or peer failure: a file or socket error, a peer that vanished.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A file or directory the user named (data, weights, checkpoints) is missing or cannot be
/// read. Malformed contents are a FormatError.
class FileError : public IoError {
 public:
  using IoError::IoError;
};

/// Another rank of the job failed, vanished or reported that it could not go on.
class PeerError : public IoError {
 public:
  using IoError::IoError;
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

/// The replicas' weights, which data parallelism keeps equal on every rank, differ (found by
/// a weight-sync check, `--check-sync`).
class ReplicaMismatch : public Mismatch {
 public:
  using Mismatch::Mismatch;
};

/// Bytes on disk or on the wire do not follow the expected format (corrupt, truncated).
class FormatError : public Error {
 public:
  using Error::Error;
};

/// Training produced a loss or gradient that is not finite (NaN or infinity).
class DivergedError : public Error {
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

/// `path` from its last "src/", "include/" or "tests/" folder on, so that messages name
/// src/cli/train_loop.cc rather than the directory kolo was built in.
constexpr const char* sourcePath(const char* path) {
  const char* start = path;
  for (const char* p = path; *p != '\0'; ++p) {
    if (*p != '/') continue;
    for (const char* folder : {"src/", "include/", "tests/"}) {
      const char* a = p + 1;
      const char* b = folder;
      while (*b != '\0' && *a == *b) ++a, ++b;
      if (*b == '\0') start = p + 1;
    }
  }
  return start;
}

}  // namespace detail
}  // namespace kolo

/// Throws ExceptionType with the message built by streaming every argument.
#define KOLO_THROW(ExceptionType, ...) throw ExceptionType(::kolo::detail::concat(__VA_ARGS__))

/// For a user's mistake (a flag, a file, a shape they chose): throws kolo::InvalidArgument
/// whose message is the arguments alone, saying what is wrong and what is accepted:
/// KOLO_REQUIRE(batch > 0, "--batch must be at least 1, got ", batch).
#define KOLO_REQUIRE(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) KOLO_THROW(::kolo::InvalidArgument, __VA_ARGS__); \
  } while (0)

/// For an invariant, or a library caller's contract: throws kolo::InternalError unless
/// `cond` holds, naming the expression and source line; extra arguments are appended.
#define KOLO_CHECK(cond, ...)                                                                 \
  do {                                                                                        \
    if (!(cond))                                                                              \
      KOLO_THROW(::kolo::InternalError, "check failed: " #cond " (",                          \
                 ::kolo::detail::sourcePath(__FILE__), ":", __LINE__, ") " __VA_OPT__(, ) __VA_ARGS__); \
  } while (0)

#define KOLO_CHECK_OP_(a, b, op, ...)                                                       \
  do {                                                                                      \
    const auto& kolo_lhs_ = (a);                                                            \
    const auto& kolo_rhs_ = (b);                                                            \
    if (!(kolo_lhs_ op kolo_rhs_))                                                          \
      KOLO_THROW(::kolo::InternalError, "check failed: " #a " " #op " " #b " (", kolo_lhs_,   \
                 " vs ", kolo_rhs_, ") at ", ::kolo::detail::sourcePath(__FILE__), ":", __LINE__, \
                 " " __VA_OPT__(, ) __VA_ARGS__);                                           \
  } while (0)

/// Comparison checks that print both sides: KOLO_CHECK_EQ(x.size(), 3, "while reading ", path).
#define KOLO_CHECK_EQ(a, b, ...) KOLO_CHECK_OP_(a, b, ==, __VA_ARGS__)
#define KOLO_CHECK_NE(a, b, ...) KOLO_CHECK_OP_(a, b, !=, __VA_ARGS__)
#define KOLO_CHECK_LT(a, b, ...) KOLO_CHECK_OP_(a, b, <, __VA_ARGS__)
#define KOLO_CHECK_LE(a, b, ...) KOLO_CHECK_OP_(a, b, <=, __VA_ARGS__)
#define KOLO_CHECK_GT(a, b, ...) KOLO_CHECK_OP_(a, b, >, __VA_ARGS__)
#define KOLO_CHECK_GE(a, b, ...) KOLO_CHECK_OP_(a, b, >=, __VA_ARGS__)
